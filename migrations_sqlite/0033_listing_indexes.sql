-- Mirrors the number of migrations/0033_listing_indexes.sql, which keeps Postgres's plans
-- made on an empty `sessions` from looking a session up through a listing's index. The
-- embedded database plans each statement afresh: nothing changes.
SELECT 1;
