-- agentq: the model a session's worker chose for it. A request may name none (the worker's
-- default, or the provider's, applies); `agentq status`, the API and the cost shown read
-- the model that answered, which only the worker knows. Written by its checkpoints.
ALTER TABLE sessions ADD COLUMN model_used text;
