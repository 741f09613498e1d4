//! How the figures of `--tool mcp` ([`McpFigures`], measured by [`crate::mcp`]) are shown:
//! rows of the table and fields of the JSON object.

use serde_json::{Value, json};

use super::{Results, Rows, num, verdict};
use crate::turns::{MCP_TOOL, TRIVIAL};

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
            "iterations/s, {TRIVIAL} in process (measured rounds: {})",
            m.pairs
        ),
        format!("{:.0}", m.builtin_iterations_per_s),
        String::new(),
    );
    rows.add(
        "",
        format!(
            "iterations/s, {MCP_TOOL} over stdio (measured rounds: {})",
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
        format!(">= made {}", verdict(m.calls_served >= m.calls_made)),
    );
}
#[cfg(test)]
mod tests {
    use super::*;

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
