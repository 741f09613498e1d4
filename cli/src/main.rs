//! The `agentq` binary: argument parsing and dispatch only; every command's logic lives in
//! its module or in the library crates.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod client;
mod run;
mod scheduler;
mod signals;
mod worker_cmd;

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
    /// Run one session in this process, streaming it to the terminal.
    Run(run::RunArgs),
    /// Consume sessions from Redis Streams and run them, checkpointing to Postgres.
    Worker(worker_cmd::WorkerArgs),
    /// Serve the HTTP API (and the sweeper) against Postgres and Redis.
    Scheduler(scheduler::SchedulerArgs),
    /// Create or upgrade the Postgres schema.
    Migrate(scheduler::MigrateArgs),
    /// Submit a session (or a JSON Lines batch) to the HTTP API.
    Submit(client::SubmitArgs),
    /// Show a session as JSON.
    Status(client::StatusArgs),
    /// Cancel a session.
    Cancel(client::CancelArgs),
    /// List sessions, newest first.
    Sessions(client::SessionsArgs),
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn"));
    let json = std::env::var("AGENTQ_LOG_FORMAT").is_ok_and(|v| v == "json");
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing();
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
            Command::Run(args) => run::run(args).await,
            Command::Scheduler(args) => scheduler::scheduler(args).await,
            Command::Migrate(args) => scheduler::migrate(args).await,
            Command::Submit(args) => client::submit(args).await,
            Command::Status(args) => client::status(args).await,
            Command::Cancel(args) => client::cancel(args).await,
            Command::Sessions(args) => client::sessions(args).await,
            Command::Worker(args) => worker_cmd::worker(args).await,
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentq: {e:#}");
            ExitCode::from(2)
        }
    }
}
