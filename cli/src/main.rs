//! The `agentq` binary: argument parsing and dispatch only; every command's logic lives in
//! its module or in the library crates.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod run;

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
