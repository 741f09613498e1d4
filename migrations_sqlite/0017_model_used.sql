-- Mirrors migrations/0017_model_used.sql: the model a session's worker chose for it.
ALTER TABLE sessions ADD COLUMN model_used TEXT;
