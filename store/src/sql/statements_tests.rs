//! The statements rendered for both dialects.

#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn sqlite_rendering_rewrites_only_the_dialect() {
    assert_eq!(
        sqlite(
            "SET a = now() + make_interval(secs => $3), b = now()",
            Some(4)
        ),
        "SET a = $3, b = $4"
    );
    assert_eq!(
        sqlite("WHERE c < now() - make_interval(secs => $1) LIMIT $2", None),
        "WHERE c < $1 LIMIT $2"
    );
    assert_eq!(
        sqlite("kind = ANY($2::text[]) AND id = ANY($1)", None),
        "kind IN (SELECT value FROM json_each($2)) AND id IN (SELECT value FROM json_each($1))"
    );
    assert_eq!(
        sqlite("VALUES ($1::uuid, $3::json) x = GREATEST(x, $2)", None),
        "VALUES ($1, $3) x = max(x, $2)"
    );
}

#[test]
fn every_statement_renders_for_both() {
    for d in [Dialect::Postgres, Dialect::Sqlite] {
        let s = Statements::new(d);
        for sql in [
            &s.select_session,
            &s.claim,
            &s.claim_history,
            &s.history,
            &s.cancel,
            &s.suspend,
            &s.release,
            &s.lease_of,
            &s.fail,
            &s.follow_up,
            &s.follow_up_message,
            &s.wake_expired,
            &s.wake_due,
            &s.wake_budget,
            &s.waiting_by_reason,
            &s.held_by_queue,
            &s.mark_enqueued,
            &s.reset_enqueued,
            &s.unenqueued,
            &s.retry,
            &s.dispatch_load,
            &s.held,
            &s.any_held,
            &s.any_held_anywhere,
            &s.release_held,
            &s.forget_expired,
            &s.beat,
            &s.retire,
            &s.lease_state,
            &s.leases_of,
            &s.ensure_worker,
            &s.mark_announced,
            &s.unannounced,
            &s.requeue_orphans,
            &s.forget_workers,
            &s.queue_exists,
            &s.insert_queue,
            &s.stored_queues,
            &s.inbox,
            &s.approval,
            &s.insert_key,
            &s.list_keys,
            &s.revoke_key,
            &s.key_by_id,
            &s.pending_approvals,
        ] {
            assert!(!sql.contains("COLS"), "{sql}");
            assert!(!sql.contains("KEY_FIELDS"), "{sql}");
            if d == Dialect::Sqlite {
                for pg_only in ["now()", "::", "ANY(", "make_interval", "GREATEST"] {
                    assert!(!sql.contains(pg_only), "{pg_only} in {sql}");
                }
            }
        }
    }
}
