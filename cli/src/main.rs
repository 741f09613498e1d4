//! The `agentq` binary: argument parsing and dispatch only; every command's logic lives in
//! its module or in the library crates.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod client;
mod demo;
mod dev;
mod examples;
mod files;
mod flags;
mod inputs;
mod keys;
#[cfg(feature = "otlp")]
mod otlp;
mod process;
mod progress;
mod retention;
mod retry;
mod run;
mod scheduler;
mod signals;
mod stack;
mod watch;
mod worker_cmd;

/// A worker holds many small, long-lived allocations per session in flight (its task, its
/// HTTP connection's buffers, its history), which the system allocator's arenas fragment.
#[cfg(feature = "jemalloc")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(
    name = "agentq",
    version,
    about = "LLM agent sessions as durable, distributed jobs"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a batch of sessions end to end on the embedded store, kill a worker midway,
    /// and summarise — no services needed.
    #[command(after_help = examples::DEMO)]
    Demo(demo::DemoArgs),
    /// The HTTP API and workers in one process, on the embedded store (./agentq.db) or on
    /// Postgres and Redis when AGENTQ_DATABASE_URL and AGENTQ_REDIS_URL are set.
    #[command(after_help = examples::DEV)]
    Dev(dev::DevArgs),
    /// Run one session in this process, streaming it to the terminal.
    #[command(after_help = examples::RUN)]
    Run(run::RunArgs),
    /// Consume sessions from Redis Streams and run them, checkpointing to Postgres.
    #[command(after_help = examples::WORKER)]
    Worker(worker_cmd::WorkerArgs),
    /// Serve the HTTP API (and the sweeper) against Postgres and Redis.
    #[command(after_help = examples::SCHEDULER)]
    Scheduler(scheduler::SchedulerArgs),
    /// Create or upgrade the Postgres schema.
    #[command(after_help = examples::MIGRATE)]
    Migrate(scheduler::MigrateArgs),
    /// Delete finished session trees older than `[retention] days` (one pass), or say
    /// what would go (`--dry-run`).
    #[command(after_help = examples::RETENTION)]
    Retention(retention::RetentionArgs),
    /// Create, list or revoke API keys in the configured store.
    #[command(after_help = examples::KEYS)]
    Keys(keys::KeysArgs),
    /// Submit a session (or a JSON Lines batch) to the HTTP API.
    Submit(client::SubmitArgs),
    /// Batches as objects: submit a JSON Lines file as one batch, follow it, read its
    /// results, cancel it, list them.
    #[command(after_help = client::BATCH_EXAMPLES)]
    Batch(client::BatchArgs),
    /// Show a session as JSON (on stderr: the tool calls it holds for approval, with the
    /// commands that decide them).
    #[command(after_help = examples::STATUS)]
    Status(client::StatusArgs),
    /// Follow a session's events live (replayed from the start), until it finishes.
    #[command(after_help = examples::WATCH)]
    Watch(watch::WatchArgs),
    /// Cancel a session.
    Cancel(client::CancelArgs),
    /// Retry failed sessions from their last checkpoint: the ids given, or with
    /// `--failed` every session that failed with an error (`--since`, `--reason` narrow it).
    Retry(retry::RetryArgs),
    /// Approve a tool call a session holds for a human (`agentq status ID` lists them).
    #[command(after_help = examples::APPROVE)]
    Approve(client::DecideArgs),
    /// The tool calls your sessions hold for a human, across sessions (`approvals list`).
    #[command(after_help = client::APPROVALS_EXAMPLES)]
    Approvals(client::ApprovalsArgs),
    /// Deny a tool call a session holds for a human.
    #[command(after_help = examples::DENY)]
    Deny(client::DecideArgs),
    /// Send a message to a session (steer it, or start a follow-up turn).
    #[command(after_help = examples::SEND)]
    Send(client::SendArgs),
    /// List sessions, newest first.
    Sessions(client::SessionsArgs),
    /// List a session's files, print one, or save one or all of them (-o DIR).
    #[command(after_help = examples::FILES)]
    Files(files::FilesArgs),
    /// Measure throughput, checkpoint cost, storage growth, capacity and recovery against
    /// what this Postgres and Redis can physically do.
    #[command(after_help = examples::BENCH)]
    Bench(agentq_bench::BenchArgs),
    /// The MCP server of `agentq bench --tool mcp`, on stdin/stdout: one read-only tool
    /// that answers at once, and a file counting the calls it answered.
    #[command(name = agentq_bench::MCP_SERVER_COMMAND, hide = true, after_help = examples::BENCH_MCP_SERVER)]
    BenchMcpServer(agentq_bench::McpServerArgs),
}

/// Logs on stderr as text (coloured on a terminal only) or JSON (`AGENTQ_LOG_FORMAT=json`),
/// filtered by `RUST_LOG`; with the `otlp` feature, spans also go to
/// `OTEL_EXPORTER_OTLP_ENDPOINT` when it is set.
fn init_tracing(default_filter: &str) {
    use std::io::IsTerminal;

    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::prelude::*;
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let json = std::env::var("AGENTQ_LOG_FORMAT").is_ok_and(|v| v == "json");
    // Escape codes are noise in a file or a log collector.
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // The filter applies to the log lines only: exported spans have their own level.
    let fmt = if json {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_filter(filter).boxed()
    };
    let registry = tracing_subscriber::registry().with(fmt);
    #[cfg(feature = "otlp")]
    let registry = registry.with(otlp::layer());
    registry.init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo kills a worker on purpose: the warnings that follow (lost leases, retried
    // claims) are the expected story, told by its own output; RUST_LOG still shows them.
    // Otherwise the start and stop lines of a process pass the default filter.
    init_tracing(if matches!(cli.command, Command::Demo(_)) {
        "error"
    } else {
        "warn,agentq::process=info"
    });
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("agentq: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let result = rt.block_on(async move {
        match cli.command {
            Command::Demo(args) => demo::demo(args).await,
            Command::Dev(args) => dev::dev(args).await,
            Command::Run(args) => run::run(args).await,
            Command::Scheduler(args) => scheduler::scheduler(args).await,
            Command::Migrate(args) => scheduler::migrate(args).await,
            Command::Keys(args) => keys::keys(args).await,
            Command::Retention(args) => retention::retention(args).await,
            Command::Submit(args) => client::submit(args).await,
            Command::Batch(args) => client::batch(args).await,
            Command::Status(args) => client::status(args).await,
            Command::Watch(args) => watch::watch(args).await,
            Command::Cancel(args) => client::cancel(args).await,
            Command::Retry(args) => retry::retry(args).await,
            Command::Approve(args) => client::decide(args, true).await,
            Command::Deny(args) => client::decide(args, false).await,
            Command::Approvals(args) => client::approvals(args).await,
            Command::Send(args) => client::send(args).await,
            Command::Sessions(args) => client::sessions(args).await,
            Command::Files(args) => files::files(args).await,
            Command::Worker(args) => worker_cmd::worker(args).await,
            Command::Bench(args) => agentq_bench::run(args).await,
            Command::BenchMcpServer(args) => agentq_bench::serve_mcp(args).await,
        }
    });
    // The exporter's blocking client must be flushed outside the runtime.
    #[cfg(feature = "otlp")]
    {
        drop(rt);
        otlp::shutdown();
    }
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentq: {e:#}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// Every command's `--help` ends with examples.
    #[test]
    fn every_help_has_examples() {
        let mut cli = Cli::command();
        cli.build();
        // (clap's own `help` subcommand excepted)
        for sub in cli.get_subcommands_mut().filter(|s| s.get_name() != "help") {
            let help = sub.render_long_help().to_string();
            assert!(
                help.contains("Examples:"),
                "agentq {} --help:\n{help}",
                sub.get_name()
            );
            // And each of its own subcommands (`agentq batch submit`, …).
            let name = sub.get_name().to_string();
            for nested in sub.get_subcommands_mut().filter(|s| s.get_name() != "help") {
                let help = nested.render_long_help().to_string();
                assert!(
                    help.contains("Examples:"),
                    "agentq {name} {} --help:\n{help}",
                    nested.get_name()
                );
            }
        }
    }
}
