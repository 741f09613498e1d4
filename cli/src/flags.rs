//! The flags that override `[worker]` and `[providers]` settings, shared by every command
//! that runs workers (`agentq worker`, `agentq dev`), so each honours the same ones. They
//! are the last layer of [`Settings::resolve`]: their environment variables and file keys
//! are read by the settings module, and their rules are checked by
//! [`Settings::validate`], which names the flag in its errors.

use std::path::PathBuf;

use clap::Args;

use agentq_core::config::{Secs, Settings};

#[derive(Args, Debug, Clone, Default)]
pub struct WorkerFlags {
    /// Sessions each worker runs at once (AGENTQ_WORKER_CONCURRENCY; default 256).
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// Queues to consume, comma-separated (default: default).
    #[arg(long, value_delimiter = ',')]
    pub queues: Option<Vec<String>>,
    /// Seconds a worker's leases last without a heartbeat (AGENTQ_LEASE_TTL_SECS;
    /// default 1.5).
    #[arg(long)]
    pub lease_ttl_secs: Option<f64>,
    /// Seconds between heartbeats, shorter than the lease TTL (AGENTQ_HEARTBEAT_SECS;
    /// default 0.5).
    #[arg(long)]
    pub heartbeat_secs: Option<f64>,
    /// Idle time after which another worker's entries are taken over
    /// (AGENTQ_RECLAIM_MIN_IDLE_SECS; default 6).
    #[arg(long)]
    pub reclaim_min_idle_secs: Option<f64>,
    /// Seconds between looks for sessions and entries of dead workers
    /// (AGENTQ_RECLAIM_INTERVAL_SECS; default 0.5).
    #[arg(long)]
    pub reclaim_interval_secs: Option<f64>,
    /// Deliveries of one session without finishing before it is dead-lettered
    /// (AGENTQ_MAX_ATTEMPTS; default 5).
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// Seconds running sessions get to reach a checkpoint on shutdown
    /// (AGENTQ_DRAIN_TIMEOUT_SECS; default 30).
    #[arg(long)]
    pub drain_timeout_secs: Option<f64>,
    /// Group commit: most checkpoints committed together (AGENTQ_CHECKPOINT_BATCH_MAX;
    /// default 256).
    #[arg(long)]
    pub checkpoint_batch_max: Option<u32>,
    /// Group commit: commits in flight at once, each on its own connection
    /// (AGENTQ_CHECKPOINT_WRITERS; default 2).
    #[arg(long)]
    pub checkpoint_writers: Option<u32>,
    /// Milliseconds the checkpoint of a response whose tool calls have no effect anywhere
    /// (read-only tools, no hook, no approval) may wait to share one commit with their
    /// results; 0 commits every response before its calls start
    /// (AGENTQ_WRITE_AHEAD_GRACE_MS; default 250).
    #[arg(long)]
    pub write_ahead_grace_ms: Option<u64>,
    /// Per-tree workspaces live under here (AGENTQ_WORKSPACE_ROOT; default
    /// ./agentq-workspaces).
    #[arg(long)]
    pub workspace_root: Option<PathBuf>,
    /// Provider for sessions that name none: openai, anthropic or scripted
    /// (AGENTQ_DEFAULT_PROVIDER). Default: scripted when --script is given, else openai
    /// when OPENAI_API_KEY or OPENAI_BASE_URL is set, else anthropic when ANTHROPIC_API_KEY
    /// or ANTHROPIC_BASE_URL is; else none, and such sessions fail saying so.
    #[arg(long)]
    pub default_provider: Option<String>,
    /// Model for sessions that name none (AGENTQ_DEFAULT_MODEL; default: the provider's).
    #[arg(long)]
    pub default_model: Option<String>,
    /// JSON script for the scripted provider, which it then is by default (AGENTQ_SCRIPT;
    /// `--default-provider scripted` alone plays its built-in demo script).
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Let http_fetch reach these private hosts (host or host:port), comma-separated
    /// (AGENTQ_ALLOWED_HOSTS).
    #[arg(long, value_delimiter = ',')]
    pub allowed_hosts: Option<Vec<String>>,
    /// Largest file a tool may write, in bytes (AGENTQ_MAX_FILE_BYTES; default 10485760).
    #[arg(long)]
    pub max_file_bytes: Option<u64>,
    /// Most bytes one workspace may hold, checked before every file tool's write
    /// (AGENTQ_WORKSPACE_QUOTA_BYTES; default 104857600).
    #[arg(long)]
    pub workspace_quota_bytes: Option<u64>,
    /// Enable the shell tool (AGENTQ_SHELL_ENABLED).
    #[arg(long)]
    pub enable_shell: bool,
}

impl WorkerFlags {
    /// Set what was given on the command line.
    pub fn apply(&self, s: &mut Settings) {
        let w = &mut s.worker;
        if let Some(n) = self.concurrency {
            w.concurrency = n as usize;
        }
        if let Some(q) = &self.queues {
            w.queues = q.clone();
        }
        for (flag, setting) in [
            (self.lease_ttl_secs, &mut w.lease_ttl_secs),
            (self.heartbeat_secs, &mut w.heartbeat_secs),
            (self.reclaim_min_idle_secs, &mut w.reclaim_min_idle_secs),
            (self.reclaim_interval_secs, &mut w.reclaim_interval_secs),
            (self.drain_timeout_secs, &mut w.drain_timeout_secs),
        ] {
            if let Some(v) = flag {
                *setting = Secs(v);
            }
        }
        if let Some(v) = self.max_attempts {
            w.max_attempts = v;
        }
        if let Some(v) = self.checkpoint_batch_max {
            w.checkpoint_batch_max = v as usize;
        }
        if let Some(v) = self.checkpoint_writers {
            w.checkpoint_writers = v as usize;
        }
        if let Some(v) = self.write_ahead_grace_ms {
            w.write_ahead_grace_ms = v;
        }
        if let Some(v) = &self.workspace_root {
            w.workspace_root = v.clone();
        }
        if let Some(v) = &self.default_provider {
            w.default_provider = Some(v.clone());
        }
        if self.default_model.is_some() {
            w.default_model = self.default_model.clone();
        }
        if let Some(h) = &self.allowed_hosts {
            w.allowed_hosts = h.clone();
        }
        if let Some(v) = self.max_file_bytes {
            w.max_file_bytes = v;
        }
        if let Some(v) = self.workspace_quota_bytes {
            w.workspace_quota_bytes = v;
        }
        if self.enable_shell {
            w.shell_enabled = true;
        }
        if let Some(path) = &self.script {
            s.providers.script = Some(path.clone());
        }
    }
}
