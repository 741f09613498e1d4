//! `agentq bench`: how close agentq comes to what its Postgres and Redis can physically do,
//! and whether its costs are what a checkpoint per iteration should cost: a commit each,
//! storage that does not grow with a session's length, bounded resumes. One process
//! measures, in order:
//!
//! 1. `ceiling` — raw one-row durable INSERT commits/s of this Postgres, and raw
//!    XADD/XREADGROUP/XACK round trips/s of this Redis, at the workers' connection count;
//! 2. `throughput` — N sessions × K iterations (scripted provider, a trivial in-memory tool,
//!    `--tool list_dir`, or `--tool mcp`: an MCP tool of the bench's own stdio server) on W
//!    in-process workers: iterations/s, and that over the commit ceiling; with `--tool mcp`
//!    also the trivial tool's rounds beside the MCP tool's, and the overhead per MCP call;
//! 3. `overhead` — p50/p99 of the loop's own time per iteration: in the same run, and with
//!    one session alone (the worker's own cost, without queueing behind other sessions);
//! 4. `storage` — bytes stored per iteration for K = 10, 40, 160;
//! 5. `resume` — time to load a 160-iteration session and have the LLM request ready;
//! 6. `capacity` — sessions one `agentq worker` child holds with a 1 s LLM, its RSS;
//! 7. `recovery` — SIGKILL a worker child, time until another worker commits its
//!    sessions' next iteration;
//! 8. `isolation` — bystander sessions' iterations/s alone and beside hostile sessions
//!    (NUL in model output, an edit bomb, huge outputs, a spinning loop, a huge timeout)
//!    on the same workers, and what became of the hostile sessions;
//! 9. `admission` — `agentq worker` children against a fake endpoint that enforces a
//!    rate limit: iterations/s under a configured limit over the limit, the share of
//!    requests refused, the limiter's Redis calls per LLM call, and throughput with a
//!    non-binding limit over none.
//! 10. `workspace` — time to have a tree's committed files on disk at a claim, for a
//!     workspace of 1,000 files and 50 MB: cold (empty cache) and warm (cache as committed).
//!
//! 11. `forks` — time and bytes of a fork against the prefix's length;
//! 12. `scale` — one tenant's budget holds/s, the WAL of a lease renewal, the limiter's
//!     calls/s on this Redis and on a 3-master Redis Cluster.
//!
//! Everything it creates is named after a run id (`bench-<id>-…` queues) and removed at the
//! end. The method and the figures are in `docs/benchmarks.md`.
//!
//! The crate is a library so that `agentq bench` stays a subcommand of the one `agentq`
//! binary: [`run`] with the [`BenchArgs`] clap parsed. The capacity and recovery parts run
//! that binary as `agentq worker` children ([`BenchArgs::agentq_binary`]), and the workers
//! of `--tool mcp` start it as their MCP server (`agentq bench-mcp-server`, [`serve_mcp`]).

mod ab;
mod admission;
mod args;
mod ceiling;
mod cleanup;
mod cpu;
mod env;
mod forks;
mod hostile;
mod isolation;
mod llm;
mod mcp;
mod mcp_server;
mod pools;
mod procs;
mod report;
mod resume;
mod scale;
mod storage;
mod turns;
mod workload;
mod workspace;

use std::process::ExitCode;

use anyhow::{Context, bail};

use agentq_core::pg::PgStore;

pub use args::{BenchArgs, PARTS};
use env::{Env, services};
pub use mcp_server::{McpServerArgs, serve as serve_mcp};
pub use report::Results;
use report::progress;
pub use turns::MCP_SERVER_COMMAND;

/// Run the parts `args` select and print their figures (a table, and with `--json` one
/// JSON object on the last line). Progress goes to stderr.
pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let selected = selection(&args.only)?;
    check_mcp_flags(&args)?;
    if args.baseline.is_some() {
        // The children get what followed `bench` on this command line.
        let argv: Vec<_> = std::env::args_os()
            .skip_while(|a| a != "bench")
            .skip(1)
            .collect();
        return ab::compare(&args, &argv).await;
    }
    let want = |p: &str| selected.iter().any(|s| s == p);
    let (db_url, redis_url, private) = services(&args)?;
    let store = PgStore::connect(&db_url, pools::ADMIN_CONNECTIONS)
        .await
        .context("cannot connect to Postgres")?;
    store.migrate().await.context("migrating the schema")?;
    let pools = pools::Pools::plan(&store, &args, &selected).await?;
    let run = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let scratch = std::env::temp_dir().join(format!("agentq-bench-{run}"));
    std::fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let cpu = cpu::Cpu::discover(&store, &redis_url).await;
    let env = Env {
        db_url,
        redis_url,
        store,
        run,
        scratch,
        args: args.clone(),
        cpu,
        pools,
        _private: private,
    };

    let mut r = Results {
        throughput_sessions: args.sessions,
        throughput_iterations: args.iterations,
        ..Results::default()
    };
    let outcome = run_parts(&env, &want, &mut r).await;
    progress("cleaning up");
    if let Err(e) = cleanup::cleanup(&env).await {
        progress(&format!("cleanup failed: {e:#}"));
    }
    let _ = std::fs::remove_dir_all(&env.scratch);
    outcome?;

    print!("{}", report::table(&r, &args));
    if args.json {
        println!("{}", report::to_json(&r, &args));
    }
    // A bystander that a hostile session brought down is what the isolation part exists
    // to catch: the run fails, after its figures are out.
    if let Some(n) = r.isolation_bystanders_failed.filter(|n| *n > 0) {
        progress(&format!(
            "isolation: {n} bystander sessions failed beside the hostile ones"
        ));
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

async fn run_parts(env: &Env, want: &dyn Fn(&str) -> bool, r: &mut Results) -> anyhow::Result<()> {
    // The throughput ratio is against the ceiling measured here, so it implies the ceiling.
    if want("ceiling") || want("throughput") {
        progress("ceiling: raw Postgres commits and Redis round trips");
        ceiling::ceiling(env, r).await?;
    }
    if want("throughput") || want("overhead") {
        progress(&format!(
            "throughput: {} sessions x {} iterations on {} workers",
            env.args.sessions, env.args.iterations, env.args.workers
        ));
        if env.tool() == turns::MCP_TOOL {
            mcp::throughput(env, r).await?;
        } else {
            workload::throughput(env, r).await?;
        }
    }
    if want("overhead") {
        progress(&format!(
            "overhead: {} sessions, each alone, {} iterations each",
            workload::ALONE_ROUNDS,
            workload::ALONE_ITERATIONS
        ));
        workload::overhead_alone(env, r).await?;
    }
    if want("storage") {
        storage::storage(env, r).await?;
    }
    if want("resume") {
        progress("resume: loading 160-iteration sessions");
        resume::resume(env, r).await?;
    }
    if want("capacity") {
        progress(&format!(
            "capacity: {} sessions, {} ms LLM latency, one worker process",
            env.args.capacity_sessions, env.args.llm_latency_ms
        ));
        procs::capacity(env, r).await?;
    }
    if want("recovery") {
        progress("recovery: SIGKILL a worker process, time until another resumes");
        procs::recovery(env, r).await?;
    }
    if want("isolation") {
        progress(&format!(
            "isolation: {} bystanders x {} iterations on {} workers, alone and beside {}% \
             hostile sessions",
            env.args.sessions, env.args.iterations, env.args.workers, env.args.hostile_percent
        ));
        isolation::isolation(env, r).await?;
    }
    if want("admission") {
        progress(&format!(
            "admission: {} sessions against a {} rpm limit, a non-binding one and none, {} s each",
            env.args.admission_sessions, env.args.admission_rpm, env.args.admission_secs
        ));
        admission::admission(env, r).await?;
    }
    if want("workspace") {
        workspace::workspace(env, r).await?;
    }
    if want("forks") {
        forks::forks(env, r).await?;
    }
    if want("scale") {
        scale::scale(env, r).await?;
    }
    Ok(())
}

/// `--tool mcp` needs a tool call per session to measure, and `--mcp-pairs` means nothing
/// without it.
fn check_mcp_flags(args: &BenchArgs) -> anyhow::Result<()> {
    if args.tool == turns::MCP && args.iterations < 2 {
        bail!(
            "--iterations {}: --tool mcp needs 2 or more (every iteration but the last makes \
             the MCP call)",
            args.iterations
        );
    }
    if args.tool != turns::MCP && args.mcp_pairs > 1 {
        bail!(
            "--mcp-pairs is for --tool mcp (this run's --tool is {})",
            args.tool
        );
    }
    Ok(())
}

fn selection(only: &[String]) -> anyhow::Result<Vec<String>> {
    if only.is_empty() {
        return Ok(PARTS.iter().map(|s| s.to_string()).collect());
    }
    let mut out = Vec::new();
    for p in only {
        let p = p.trim().to_ascii_lowercase();
        if p.is_empty() {
            continue;
        }
        if !PARTS.contains(&p.as_str()) {
            bail!("--only: unknown part {p:?} (parts: {})", PARTS.join(", "));
        }
        out.push(p);
    }
    Ok(out)
}
