//! How the parts that run worker processes (capacity, recovery) are shown: rows of the
//! table.

use super::{Results, Rows, verdict};
use crate::args::BenchArgs;

/// One worker process under many slow sessions.
pub(super) fn capacity_rows(r: &Results, args: &BenchArgs, rows: &mut Rows) {
    if let Some(n) = r.capacity_sessions {
        let rss = r.capacity_rss_bytes.unwrap_or(0);
        // The default offer's target, and the one for a worker holding 50,000 sessions
        // (`--capacity-sessions 50000`).
        let (want, gib) = if r.capacity_offered.unwrap_or(0) >= 50_000 {
            (50_000, 2u64)
        } else {
            (5_000, 1)
        };
        rows.add(
            "capacity",
            format!(
                "sessions in flight, one worker ({} offered, {} ms LLM, {})",
                r.capacity_offered.unwrap_or(0),
                args.llm_latency_ms,
                r.capacity_http2
                    .filter(|&h2| h2)
                    .map_or("HTTP/1.1", |_| "HTTP/2")
            ),
            n.to_string(),
            format!(
                ">= {want} under {gib} GiB {}",
                verdict(n >= want && rss < gib << 30)
            ),
        );
        rows.add(
            "",
            "iterations/s at that load".into(),
            format!("{:.0}", r.capacity_iterations_per_s.unwrap_or(0.0)),
            String::new(),
        );
        if let Some(ramp) = r.capacity_ramp_s {
            rows.add(
                "",
                "until all were in flight".into(),
                format!("{ramp:.1} s"),
                String::new(),
            );
        }
        rows.add(
            "",
            "worker peak RSS (VmHWM)".into(),
            format!("{:.0} MiB", rss as f64 / (1u64 << 20) as f64),
            String::new(),
        );
        if let Some(turns) = r.capacity_iterations_per_session {
            // The peak grows with the history the sessions hold: a faster machine's run
            // reaches more turns in the same seconds.
            rows.add(
                "",
                "iterations per session at the peak".into(),
                format!("{turns:.1}"),
                String::new(),
            );
        }
    }
}

/// A SIGKILLed worker's sessions, resumed elsewhere.
pub(super) fn recovery_rows(r: &Results, rows: &mut Rows) {
    if let Some(x) = r.recovery_s {
        rows.add(
            "recovery",
            format!(
                "SIGKILL to next iteration elsewhere, max of {} (p50 {:.2} s)",
                r.recovery_sessions.unwrap_or(0),
                r.recovery_p50_s.unwrap_or(0.0)
            ),
            format!("{x:.2} s"),
            format!("< 10 s {}", verdict(x < 10.0)),
        );
    }
}
