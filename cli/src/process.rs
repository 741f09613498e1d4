//! What every long-running process (`agentq worker`, `agentq scheduler`, `agentq dev`) does
//! at its edges: the one line it logs when it starts and the one when it stops, and its
//! `/metrics` listener, which must be its own.
//!
//! The lines go through `tracing` under [`TARGET`], which the default filter lets through
//! at info: an operator sees what a process runs with (and why it ended) without turning
//! on every other info line.

use std::net::SocketAddr;

use anyhow::Context;
use tokio::net::TcpListener;

use agentq_worker::WorkerSettings;

use crate::stack::redact;

/// The tracing target of the start and stop lines (and the default filter's exception).
pub use agentq_core::PROCESS_TARGET as TARGET;

/// What a process runs with, as its start line says it. A field that does not apply to
/// the process (the scheduler runs no sessions) is `-`.
pub struct Start {
    pub command: &'static str,
    pub id: String,
    pub queues: Vec<String>,
    pub concurrency: String,
    pub provider: String,
    pub model: String,
    pub key_set: bool,
    /// Already without secrets ([`redact`]).
    pub store: String,
    pub queue: String,
    pub api: String,
    pub metrics: String,
}

impl Start {
    /// A process that runs sessions: its workers' settings fill in what they decide.
    pub fn for_workers(command: &'static str, id: String, w: &WorkerSettings) -> Start {
        let (provider, model, key_set) = provider_of(w);
        Start {
            command,
            id,
            queues: w.queues.clone(),
            concurrency: w.concurrency.to_string(),
            provider,
            model,
            key_set,
            store: "-".into(),
            queue: "-".into(),
            api: "-".into(),
            metrics: "-".into(),
        }
    }

    /// Postgres and Redis, as the line shows them.
    pub fn services(mut self, database_url: &str, redis_url: &str) -> Start {
        self.store = redact(database_url);
        self.queue = redact(redis_url);
        self
    }

    pub fn log(&self) {
        tracing::info!(
            target: TARGET,
            version = %env!("CARGO_PKG_VERSION"),
            id = %self.id,
            queues = %self.queues.join(","),
            concurrency = %self.concurrency,
            provider = %self.provider,
            model = %self.model,
            key_set = self.key_set,
            store = %self.store,
            queue = %self.queue,
            api = %self.api,
            metrics = %self.metrics,
            "agentq {} started",
            self.command
        );
    }
}

/// The default provider, its model, and whether a key for it is configured (never the
/// key). The scripted provider needs none, so it has none; without a provider both are
/// `none`.
fn provider_of(w: &WorkerSettings) -> (String, String, bool) {
    let Some(provider) = w.default_provider.clone() else {
        return ("none".into(), "none".into(), false);
    };
    let model = w.default_model().unwrap_or("none").to_string();
    let key_set = match provider.as_str() {
        "openai" => w.providers.openai_api_key.is_some(),
        "anthropic" => w.providers.anthropic_api_key.is_some(),
        _ => false,
    };
    (provider, model, key_set)
}

/// One line on stderr when no model is configured: every session that names no provider
/// will fail, and the operator should hear why before the first one does.
pub fn warn_without_model(command: &str, w: &WorkerSettings) {
    if w.default_provider.is_none() {
        eprintln!("agentq {command}: {}", agentq_core::config::NO_MODEL);
    }
}

/// Why a process ended, for its stop line.
pub enum Stop<'a> {
    /// It was asked to stop (by a signal, normally) and its sessions drained (`finished`)
    /// or it stopped waiting for them.
    Drained { finished: bool },
    /// Something failed; the error is also what the process exits with.
    Failed(&'a anyhow::Error),
}

pub fn stopped(command: &str, why: Stop<'_>) {
    match why {
        Stop::Drained { finished } => {
            let signal = crate::signals::received();
            tracing::info!(
                target: TARGET,
                reason = %if signal.is_some() { "signal" } else { "shutdown" },
                signal = %signal.unwrap_or("-"),
                drain = %if finished { "finished" } else { "timed-out" },
                "agentq {command} stopped"
            );
        }
        Stop::Failed(e) => tracing::info!(
            target: TARGET,
            reason = %"error",
            error = %format_args!("{e:#}"),
            "agentq {command} stopped"
        ),
    }
}

/// The `/metrics` listener on `addr`. A port already taken (another worker on this host)
/// is refused here, before anything starts: a process that quietly serves no metrics is
/// one nobody notices is missing from the dashboards.
pub async fn bind_metrics(addr: &str) -> anyhow::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await.with_context(|| {
        format!(
            "cannot serve /metrics on {addr} (--metrics-addr, AGENTQ_METRICS_ADDR): give each \
             process on this host its own port, or 127.0.0.1:0 for any free one"
        )
    })?;
    let bound = listener
        .local_addr()
        .with_context(|| format!("cannot read the address /metrics is served on ({addr})"))?;
    Ok((listener, bound))
}
