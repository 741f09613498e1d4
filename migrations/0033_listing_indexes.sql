-- agentq: the listings' indexes on `sessions` (by status, by tenant, each newest first)
-- hold the same rows as before, but as partial indexes whose condition a key lookup does
-- not imply, so that no plan can look a session up through them.
--
-- Both indexes have `id` as their second column. A statement that names a session by its
-- key could be planned as a pass over either index, checking `id` in every entry. With
-- statistics, Postgres sees that pass as costing the whole index and takes the key's own
-- index. But where `sessions` was analyzed or vacuumed while empty (after retention
-- removed its rows), every index looks alike to it, one page and one row, and it took
-- whichever index was made last: `sessions_status_id_idx`, rebuilt by 0032. A worker's
-- connections keep a plan made then (generic plans) until the table is analyzed again,
-- up to a minute into a burst: in one of 10,000 sessions, each heartbeat's lease and each
-- commit's row read the whole index, a heartbeat took over a second against a lease of
-- 1.5 s, and Postgres spent twice its usual CPU per iteration.
--
-- `status` and `tenant` are never NULL, so the conditions exclude no row; a listing's
-- `status = …` or `tenant = …` implies them, so listings use the indexes as before.
-- Building them reads the table once each, under its lock.
DROP INDEX sessions_status_id_idx;
CREATE INDEX sessions_status_id_idx ON sessions (status, id DESC) WHERE status IS NOT NULL;

DROP INDEX sessions_tenant_id_idx;
CREATE INDEX sessions_tenant_id_idx ON sessions (tenant, id DESC) WHERE tenant IS NOT NULL;
