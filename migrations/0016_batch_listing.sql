-- agentq: a batch's sessions by id (`GET /v1/sessions?batch_id=`, and cancelling or
-- retrying a batch), newest first, without reading the sessions of other batches.
CREATE INDEX sessions_batch_idx ON sessions (batch_id, id) WHERE batch_id IS NOT NULL;
