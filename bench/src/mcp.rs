//! The throughput part with `--tool mcp`: rounds with the MCP tool beside rounds with the
//! trivial in-process tool, which answers the same at once, so that the difference is what
//! an MCP call costs over a tool in process (the transport, the protocol, the server
//! process). Its figures are [`McpFigures`]: iterations/s of each, the overhead per MCP
//! call, the CPU per call, and the calls the servers answered against those the sessions
//! made.

use crate::env::Env;
use crate::report::mcp::McpFigures;
use crate::report::{Results, progress};
use crate::turns::{MCP_TOOL, TRIVIAL};
use crate::workload::{Ran, record_throughput, run_workload, throughput_workload};

/// `--mcp-pairs` pairs of rounds on fresh workers, the order alternating within pairs.
/// Records [`McpFigures`] in `r`, and the MCP rounds, as one, as the part's figures.
pub async fn throughput(env: &Env, r: &mut Results) -> anyhow::Result<()> {
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
    let builtin_failed = figures.builtin_failed;
    r.mcp = Some(figures);
    record_throughput(r, &mcp);
    // Sessions of the part that did not complete, whichever tool they called.
    r.throughput_failed = Some(mcp.failed + builtin_failed);
    Ok(())
}
/// What a call adds to the time per iteration, in milliseconds: the difference of the
/// times per iteration (`1 / rate`) over the calls per iteration. Negative when the MCP
/// rounds ran faster (noise, on a figure smaller than the run's drift).
pub fn overhead_ms_per_call(builtin_rate: f64, mcp_rate: f64, calls_per_iteration: f64) -> f64 {
    (1000.0 / mcp_rate - 1000.0 / builtin_rate) / calls_per_iteration
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
}
