//! The throughput part with `--tool mcp`: rounds with the MCP tool beside rounds with the
//! trivial in-process tool, which answers the same at once, so that the difference is what
//! an MCP call costs over a tool in process (the transport, the protocol, the server
//! process); and its figures ([`McpFigures`]): iterations/s of each, the overhead per MCP
//! call, and the calls the servers answered against those the sessions made.

use serde_json::{Value, json};

use crate::env::Env;
use crate::report::{Results, Rows, num, progress};
use crate::turns::{MCP_TOOL, TRIVIAL};
use crate::workload::{Ran, run_workload, throughput_workload};

/// What the throughput part measured with the MCP tool and beside it.
#[derive(Debug, Default, Clone)]
pub struct McpFigures {
    pub pairs: u32,
    /// Iterations/s with the trivial tool, and with the MCP one, over all their rounds.
    pub builtin_iterations_per_s: f64,
    pub mcp_iterations_per_s: f64,
    /// Tool calls per iteration: every turn but the last makes one.
    pub calls_per_iteration: f64,
    /// What an MCP call adds: the difference of the time per iteration (the inverse of
    /// iterations/s), over the calls per iteration.
    pub overhead_ms_per_call: f64,
    /// CPU per call of the measured rounds: what this process (the workers, the MCP
    /// client) spent more per iteration with the MCP tool, over the calls per iteration;
    /// and the servers' own.
    pub client_cpu_ms_per_call: Option<f64>,
    pub server_cpu_ms_per_call: Option<f64>,
    /// Calls the MCP rounds' sessions made, and calls their servers answered (warm-up
    /// rounds included).
    pub calls_made: u64,
    pub calls_served: u64,
    /// Sessions of the trivial tool's rounds that did not complete.
    pub builtin_failed: u64,
    /// Each measured round in the order run: the tool, its iterations/s.
    pub rounds: Vec<(&'static str, f64)>,
}

/// `--mcp-pairs` pairs of rounds on fresh workers, the order alternating within pairs.
/// Records [`McpFigures`] in `r` and returns the MCP rounds as one, whose figures are the
/// part's.
pub async fn throughput(env: &Env, r: &mut Results) -> anyhow::Result<Ran> {
    let pairs = env.args.mcp_pairs;
    let mut builtin: Option<Ran> = None;
    let mut mcp: Option<Ran> = None;
    let mut rounds = Vec::new();
    for pair in 0..pairs {
        let order = if pair % 2 == 0 {
            [TRIVIAL, MCP_TOOL]
        } else {
            [MCP_TOOL, TRIVIAL]
        };
        for tool in order {
            progress(&format!("throughput: pair {}/{pairs}, {tool}", pair + 1));
            let ran = run_workload(env, &throughput_workload(env, tool)).await?;
            let rate = ran.iterations / ran.elapsed.as_secs_f64();
            progress(&format!("throughput: {tool}: {rate:.0} iterations/s"));
            rounds.push((tool, rate));
            let slot = if tool == MCP_TOOL {
                &mut mcp
            } else {
                &mut builtin
            };
            *slot = Some(match slot.take() {
                Some(before) => before.merge(ran),
                None => ran,
            });
        }
    }
    let (Some(builtin), Some(mcp)) = (builtin, mcp) else {
        anyhow::bail!("--mcp-pairs: no pair of rounds ran");
    };
    let (calls_served, calls_made) = mcp.mcp_calls.unwrap_or_default();
    let iterations = f64::from(env.args.iterations);
    let calls_per_iteration = (iterations - 1.0) / iterations;
    let rate = |ran: &Ran| ran.iterations / ran.elapsed.as_secs_f64();
    let (builtin_rate, mcp_rate) = (rate(&builtin), rate(&mcp));
    let measured_calls = mcp.iterations * calls_per_iteration;
    let own_per_iteration = |ran: &Ran| ran.cpu.own.map(|s| s * 1000.0 / ran.iterations);
    let figures = McpFigures {
        pairs,
        builtin_iterations_per_s: builtin_rate,
        mcp_iterations_per_s: mcp_rate,
        calls_per_iteration,
        overhead_ms_per_call: overhead_ms_per_call(builtin_rate, mcp_rate, calls_per_iteration),
        client_cpu_ms_per_call: own_per_iteration(&mcp)
            .zip(own_per_iteration(&builtin))
            .map(|(m, b)| (m - b) / calls_per_iteration),
        server_cpu_ms_per_call: mcp.cpu.mcp_servers.map(|s| s * 1000.0 / measured_calls),
        calls_made,
        calls_served,
        builtin_failed: builtin.failed,
        rounds,
    };
    progress(&format!(
        "throughput: {:.0} iterations/s with {TRIVIAL}, {:.0} with {MCP_TOOL}: {:.3} ms per MCP \
         call; {calls_served} calls answered of {calls_made} made",
        figures.builtin_iterations_per_s,
        figures.mcp_iterations_per_s,
        figures.overhead_ms_per_call
    ));
    r.mcp = Some(figures);
    Ok(mcp)
}

/// What a call adds to the time per iteration, in milliseconds: the difference of the
/// times per iteration (`1 / rate`) over the calls per iteration. Negative when the MCP
/// rounds ran faster (noise, on a figure smaller than the run's drift).
pub fn overhead_ms_per_call(builtin_rate: f64, mcp_rate: f64, calls_per_iteration: f64) -> f64 {
    (1000.0 / mcp_rate - 1000.0 / builtin_rate) / calls_per_iteration
}

/// The figures as JSON fields (all null when the part did not run with `--tool mcp`).
pub fn to_json(m: Option<&McpFigures>) -> Vec<(&'static str, Value)> {
    vec![
        ("mcp_builtin_tool", json!(m.map(|_| TRIVIAL))),
        ("mcp_pairs", json!(m.map(|m| m.pairs))),
        (
            "mcp_builtin_iterations_per_s",
            num(m.map(|m| m.builtin_iterations_per_s), 1),
        ),
        (
            "mcp_iterations_per_s",
            num(m.map(|m| m.mcp_iterations_per_s), 1),
        ),
        (
            "mcp_calls_per_iteration",
            num(m.map(|m| m.calls_per_iteration), 4),
        ),
        (
            "mcp_overhead_ms_per_call",
            num(m.map(|m| m.overhead_ms_per_call), 4),
        ),
        (
            "mcp_client_cpu_ms_per_call",
            num(m.and_then(|m| m.client_cpu_ms_per_call), 4),
        ),
        (
            "mcp_server_cpu_ms_per_call",
            num(m.and_then(|m| m.server_cpu_ms_per_call), 4),
        ),
        ("mcp_calls_made", json!(m.map(|m| m.calls_made))),
        ("mcp_calls_served", json!(m.map(|m| m.calls_served))),
        (
            "mcp_rounds",
            json!(m.map(|m| {
                m.rounds
                    .iter()
                    .map(|(tool, rate)| json!({"tool": tool, "iterations_per_s": num(Some(*rate), 1)}))
                    .collect::<Vec<_>>()
            })),
        ),
    ]
}

/// The table's rows.
pub fn rows(r: &Results, rows: &mut Rows) {
    let Some(m) = &r.mcp else {
        return;
    };
    rows.add(
        "mcp",
        format!(
            "iterations/s, {TRIVIAL} in process ({} measured rounds)",
            m.pairs
        ),
        format!("{:.0}", m.builtin_iterations_per_s),
        String::new(),
    );
    rows.add(
        "",
        format!(
            "iterations/s, {MCP_TOOL} over stdio ({} measured rounds)",
            m.pairs
        ),
        format!("{:.0}", m.mcp_iterations_per_s),
        String::new(),
    );
    rows.add(
        "",
        format!(
            "overhead per MCP call ({:.2} calls per iteration)",
            m.calls_per_iteration
        ),
        format!("{:.3} ms", m.overhead_ms_per_call),
        String::new(),
    );
    if let (Some(client), Some(server)) = (m.client_cpu_ms_per_call, m.server_cpu_ms_per_call) {
        rows.add(
            "",
            "CPU per MCP call: workers (client) + servers".into(),
            format!("{client:.3} + {server:.3} ms"),
            String::new(),
        );
    }
    rows.add(
        "",
        "MCP calls answered by the servers / made by the sessions".into(),
        format!("{} / {}", m.calls_served, m.calls_made),
        format!(
            ">= made {}",
            crate::report::verdict(m.calls_served >= m.calls_made)
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_overhead_per_call_is_the_time_per_iteration_added_per_call() {
        // 1000/s is 1 ms an iteration, 800/s 1.25 ms: 0.25 ms more per iteration, with
        // half a call per iteration is 0.5 ms a call.
        let x = overhead_ms_per_call(1000.0, 800.0, 0.5);
        assert!((x - 0.5).abs() < 1e-9, "{x}");
        assert!(overhead_ms_per_call(800.0, 1000.0, 0.5) < 0.0);
    }

    #[test]
    fn the_json_has_every_field_null_when_the_part_did_not_run() {
        for (key, v) in to_json(None) {
            assert!(v.is_null(), "{key}: {v}");
        }
        let m = McpFigures {
            pairs: 1,
            builtin_iterations_per_s: 1000.0,
            mcp_iterations_per_s: 800.0,
            calls_per_iteration: 0.5,
            overhead_ms_per_call: 0.5,
            client_cpu_ms_per_call: None,
            server_cpu_ms_per_call: None,
            calls_made: 10,
            calls_served: 10,
            builtin_failed: 0,
            rounds: vec![(TRIVIAL, 1000.0), (MCP_TOOL, 800.0)],
        };
        let j: serde_json::Map<String, Value> = to_json(Some(&m))
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        assert_eq!(j["mcp_overhead_ms_per_call"], 0.5);
        assert_eq!(j["mcp_calls_served"], 10);
        assert_eq!(j["mcp_rounds"][1]["tool"], MCP_TOOL);
        assert!(j["mcp_server_cpu_ms_per_call"].is_null());
    }
}
