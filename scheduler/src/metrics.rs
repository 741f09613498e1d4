//! The gauges `GET /metrics` refreshes before it renders the process registry
//! ([`agentq_core::metrics::global`]) in the Prometheus text format: on every
//! scrape (`XINFO GROUPS` + `XLEN` per queue): `agentq_queue_length` (what waits: lag plus
//! pending, [`QueueStats::waiting`], not the stream's acknowledged history),
//! `agentq_queue_pending` and `agentq_queue_lag` for the configured queues and any other
//! queue this scheduler has enqueued to.
//!
//! A queue whose lag Redis cannot tell (no consumer group yet, or a group whose lag is
//! unknown after `XDEL`/trimming) exports no `agentq_queue_lag` series rather than a made-up
//! value; a queue whose stats cannot be read (Redis down) exports none of the three, so a
//! dashboard shows a gap instead of stale numbers.

use std::time::Duration;

use agentq_core::WaitReason;
use agentq_core::metrics::Metrics;
use agentq_core::queue::QueueStats;

/// Upper bound on one queue's stats during a scrape (Prometheus times out at 10 s).
pub(crate) const STATS_TIMEOUT: Duration = Duration::from_secs(2);
/// The content type of the Prometheus text format.
pub(crate) const CONTENT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Set (or clear) one queue's gauges.
pub fn record_queue(m: &Metrics, queue: &str, stats: Option<QueueStats>) {
    let gauge_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    match stats {
        Some(st) => {
            m.queue_length
                .with_label_values(&[queue])
                .set(gauge_i64(st.waiting()));
            m.queue_pending
                .with_label_values(&[queue])
                .set(gauge_i64(st.pending));
            match st.lag {
                Some(lag) => m.queue_lag.with_label_values(&[queue]).set(gauge_i64(lag)),
                None => {
                    let _ = m.queue_lag.remove_label_values(&[queue]);
                }
            }
        }
        None => {
            let _ = m.queue_length.remove_label_values(&[queue]);
            let _ = m.queue_pending.remove_label_values(&[queue]);
            let _ = m.queue_lag.remove_label_values(&[queue]);
        }
    }
}

/// `agentq_sessions_waiting{reason}`: suspended sessions by what they wait for (every
/// reason is set, 0 when none waits for it).
pub fn record_waiting(m: &Metrics, counts: &[(WaitReason, u64)]) {
    for reason in WaitReason::ALL {
        let n: u64 = counts
            .iter()
            .filter(|(r, _)| *r == reason)
            .map(|(_, n)| *n)
            .sum();
        m.sessions_waiting
            .with_label_values(&[reason.as_str()])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// `agentq_sessions_held{queue}`: every queue of `queues` is set (0 when none is held
/// there), and so is any other queue the store holds sessions in.
pub fn record_held(m: &Metrics, queues: &[String], counts: &[(String, u64)]) {
    for q in queues {
        if !counts.iter().any(|(c, _)| c == q) {
            m.sessions_held.with_label_values(&[q.as_str()]).set(0);
        }
    }
    for (q, n) in counts {
        m.sessions_held
            .with_label_values(&[q.as_str()])
            .set(i64::try_from(*n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn waiting_sessions_by_reason() {
        let m = Metrics::new();
        record_waiting(
            &m,
            &[
                (WaitReason::Children, 3),
                (WaitReason::Approval, 2),
                (WaitReason::RateLimit, 5),
            ],
        );
        let text = m.render();
        assert!(
            text.contains("agentq_sessions_waiting{reason=\"children\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("agentq_sessions_waiting{reason=\"approval\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("agentq_sessions_waiting{reason=\"rate_limit\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("agentq_sessions_waiting{reason=\"budget\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn held_sessions_by_queue() {
        let m = Metrics::new();
        record_held(
            &m,
            &["default".to_string(), "fast".to_string()],
            &[("default".to_string(), 7), ("old".to_string(), 1)],
        );
        let text = m.render();
        for line in [
            "agentq_sessions_held{queue=\"default\"} 7",
            "agentq_sessions_held{queue=\"fast\"} 0",
            "agentq_sessions_held{queue=\"old\"} 1",
        ] {
            assert!(text.contains(line), "{line}: {text}");
        }
        // Released: the gauge falls back to 0.
        record_held(&m, &["default".to_string()], &[]);
        assert!(
            m.render()
                .contains("agentq_sessions_held{queue=\"default\"} 0")
        );
    }

    #[test]
    fn unknown_lag_is_not_exported() {
        let m = Metrics::new();
        record_queue(
            &m,
            "default",
            Some(QueueStats {
                length: 5,
                pending: 2,
                lag: Some(3),
            }),
        );
        let text = m.render();
        assert!(text.contains("agentq_queue_length{queue=\"default\"} 5"));
        assert!(text.contains("agentq_queue_pending{queue=\"default\"} 2"));
        assert!(text.contains("agentq_queue_lag{queue=\"default\"} 3"));
        record_queue(
            &m,
            "default",
            Some(QueueStats {
                length: 5,
                pending: 2,
                lag: None,
            }),
        );
        assert!(!m.render().contains("agentq_queue_lag{"));
        // Acknowledged history in the stream is not what waits.
        record_queue(
            &m,
            "default",
            Some(QueueStats {
                length: 1000,
                pending: 2,
                lag: Some(1),
            }),
        );
        assert!(
            m.render()
                .contains("agentq_queue_length{queue=\"default\"} 3")
        );
        record_queue(&m, "default", None);
        assert!(!m.render().contains("agentq_queue_length{"));
    }
}
