-- Mirrors migrations/0016_batch_listing.sql: a batch's sessions by id.
CREATE INDEX sessions_batch_idx ON sessions (batch_id, id) WHERE batch_id IS NOT NULL;
