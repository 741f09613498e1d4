//! The statements of liveness in the store, shared by both dialects (rendered by
//! `statements`, whose child this is): a worker's liveness row (its heartbeat, its retirement, the
//! row made at a claim), the leases a heartbeat reads, the sessions of dead workers to
//! re-queue, and the mark of a finished session whose settle steps are done.

use super::Shared;

/// A worker's heartbeat: its liveness row, live for `$2` seconds more (SQLite: until
/// `$2`). One small row whose only index is its key, so a renewal is a HOT update.
pub(super) const BEAT: Shared = Shared {
    text: "INSERT INTO workers (id, expires_at, started_at) \
           VALUES ($1, now() + make_interval(secs => $2), now()) \
           ON CONFLICT (id) DO UPDATE SET expires_at = EXCLUDED.expires_at",
    sqlite_now: Some(3),
};

/// The running sessions a worker owns, as leases (`root_id, id, lease_epoch`) with
/// their queue.
pub(super) const LEASES_OF: Shared = Shared {
    text: "SELECT root_id, id, lease_epoch, queue FROM sessions \
           WHERE status = 'running' AND lease_owner = $1",
    sqlite_now: None,
};

/// A finished session's settle steps are done (its family told, its follow-up started,
/// its completion published): the sweeper no longer re-drives them. Its row in
/// `unannounced` (made by a trigger when the session finished) goes; the session's own
/// row is not written again. (Postgres deletes the marks that arrive together in one
/// statement: `pg/announce_rounds.rs`.)
pub(super) const MARK_ANNOUNCED: Shared = Shared {
    text: "DELETE FROM unannounced WHERE id = $1",
    sqlite_now: None,
};

/// Finished sessions whose settle steps were not marked done `$1` seconds after their
/// finish (SQLite: before `$1`), those finished first first: their worker died between
/// the terminal commit and the end of settling (the entry was acked at the claim, so no
/// redelivery settles them). Found through `unannounced`, which holds only those.
pub(super) const UNANNOUNCED: Shared = Shared {
    text: "SELECT COLS FROM sessions \
           WHERE id IN (SELECT id FROM unannounced \
                        WHERE finished_at < now() - make_interval(secs => $1) \
                        ORDER BY finished_at LIMIT $2) \
           ORDER BY finished_at",
    sqlite_now: None,
};

/// A worker stopping: its row expires now, so whatever it still owns is taken over at once.
pub(super) const RETIRE: Shared = Shared {
    text: "UPDATE workers SET expires_at = now() WHERE id = $1 AND expires_at > now()",
    sqlite_now: Some(2),
};

/// What a heartbeat reads of each of its leases (no write): the row's epoch, owner and
/// cancel flag.
pub(super) const LEASE_STATE: Shared = Shared {
    text: "SELECT lease_epoch, lease_owner, cancel_requested FROM sessions \
           WHERE root_id = $1 AND id = $2",
    sqlite_now: None,
};

/// Running sessions of the queues `$1` whose owner's row expired (and whose own claim
/// expiry is behind too) and whose entry was added while that owner lived, or is not
/// recorded: forget the entry and return them, for the caller to add a new one at once.
/// Driven by the `workers` rows that expired (few), through the running sessions' owner
/// index, so a pass when nobody died reads no session. A session comes back until the
/// caller records its new entry (after the owner's expiry: not again for that death);
/// concurrent passes (every worker runs one) may both return it, and the duplicate entry
/// is harmless.
pub(super) const REQUEUE_ORPHANS: Shared = Shared {
    text: "UPDATE sessions SET enqueued_at = NULL \
           WHERE id IN (SELECT s.id FROM workers w \
                        JOIN sessions s ON s.lease_owner = w.id AND s.status = 'running' \
                        WHERE w.expires_at < now() AND s.lease_expires_at < now() \
                          AND (s.enqueued_at IS NULL OR s.enqueued_at < w.expires_at) \
                          AND s.queue = ANY($1::text[]) \
                        LIMIT $2) \
             AND status = 'running' \
           RETURNING id, queue",
    sqlite_now: Some(3),
};

/// Rows of workers that stopped more than `$1` seconds ago (SQLite: before `$1`) and own
/// no running session any more.
pub(super) const FORGET_WORKERS: Shared = Shared {
    text: "DELETE FROM workers WHERE expires_at < now() - make_interval(secs => $1) \
           AND NOT EXISTS (SELECT 1 FROM sessions s WHERE s.lease_owner = workers.id \
                           AND s.status = 'running')",
    sqlite_now: None,
};

/// Every claimant has a liveness row, so that one dying before its first heartbeat is
/// found like any other ([`REQUEUE_ORPHANS`]): created at the claim if missing, expired
/// from the start (until its first heartbeat the claim's own expiry holds the lease).
/// On SQLite a statement before `CLAIM`; on Postgres [`PG_ENSURE_WORKER`].
pub(super) const ENSURE_WORKER: Shared = Shared {
    text: "INSERT INTO workers (id, expires_at, started_at) VALUES ($1, now(), now()) \
           ON CONFLICT (id) DO NOTHING",
    sqlite_now: Some(2),
};

/// [`ENSURE_WORKER`] as a prefix of Postgres' `CLAIM` (one round trip), with the
/// claim's `$2`, the owner.
pub(super) const PG_ENSURE_WORKER: &str = "WITH ensured AS (INSERT INTO workers (id, expires_at, started_at) \
     VALUES ($2, now(), now()) ON CONFLICT (id) DO NOTHING) ";
