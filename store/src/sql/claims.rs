//! The claim's statements, shared by both dialects (rendered by `statements`, whose child
//! this is): the lone claim, Postgres' group claim, and the parts both are written from
//! (what a claim writes, which rows it may take, what it answers).

use super::Shared;

/// The claim: one conditional update. Runnable (`queued`, or `running` under a dead lease
/// (see [`super::LEASE_DEAD`]) or our own), never terminal or suspended; taking a `running` row
/// from another owner is a takeover, counted. `$3`: the lease's length in seconds
/// (SQLite: its expiry), which covers the claim until the owner's next heartbeat.
pub(super) const CLAIM: Shared = Shared {
    text: "
UPDATE sessions SET CLAIM_SET
WHERE id = $1 AND CLAIM_RUNNABLE
RETURNING CLAIMED",
    sqlite_now: Some(4),
};

/// What a claim writes, with `$2` the owner and `$3` the lease's length.
pub(super) const CLAIM_SET: &str = "
    lease_owner = $2,
    lease_epoch = lease_epoch + 1,
    lease_expires_at = now() + make_interval(secs => $3),
    status = 'running',
    attempts = attempts + 1,
    takeovers = takeovers
        + CASE WHEN status = 'running' AND lease_owner IS NOT NULL AND lease_owner <> $2
          THEN 1 ELSE 0 END,
    held = false,
    updated_at = now()";

/// Whether `sessions`' row may be claimed by `$2`.
pub(super) const CLAIM_RUNNABLE: &str = "status IN ('queued', 'running') \
    AND (lease_owner IS NULL OR lease_owner = $2 OR (LEASE_DEAD))";

/// What a claim answers: the claimed row and whether its tree has files.
pub(super) const CLAIMED: &str = "COLS,
    EXISTS (SELECT 1 FROM workspace_files w WHERE w.root_id = sessions.root_id) AS has_workspace";

/// Postgres' group claim: [`CLAIM`] for every id of `$1` at once (one statement, one
/// durable commit), each row on the same conditions. The rows are locked in key order, as
/// the group commit locks them, so that two such statements never wait on each other in a
/// cycle; a locked row is then updated by that lock's holder alone, so the update writes
/// what the condition was checked on.
///
/// Each id is looked up by itself (a `LATERAL` subquery with a `LIMIT`, which Postgres
/// cannot turn into a join), and each row is then locked by itself, once per key of
/// `found` in its sorted order. As a join, the worker's generic plan, which expects ten
/// ids and, from statistics taken while most sessions had finished, few runnable rows,
/// read every runnable session and compared it with every id, so that a claim cost in
/// proportion to the backlog times the batch.
pub(super) const CLAIM_BATCH: Shared = Shared {
    text: "
c AS (
    SELECT DISTINCT unnest($1::text[]) AS id
), found AS (
    SELECT f.root_id, f.id FROM c
    CROSS JOIN LATERAL (SELECT root_id, id FROM sessions WHERE sessions.id = c.id LIMIT 1) f
    ORDER BY f.root_id, f.id
), locked AS (
    SELECT l.claimed_root, l.claimed_id FROM found
    CROSS JOIN LATERAL (
        SELECT sessions.root_id AS claimed_root, sessions.id AS claimed_id FROM sessions
        WHERE sessions.root_id = found.root_id AND sessions.id = found.id AND CLAIM_RUNNABLE
        LIMIT 1
        FOR UPDATE OF sessions
    ) l
)
UPDATE sessions SET CLAIM_SET
FROM locked
WHERE sessions.root_id = locked.claimed_root AND sessions.id = locked.claimed_id
RETURNING CLAIMED",
    sqlite_now: None,
};
