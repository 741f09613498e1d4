//! `[worker]`: how a worker process runs sessions, each field with its default.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::section::section;
use super::values::Secs;

section! {
    /// `[worker]`: how a worker process runs sessions.
    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct WorkerSection {
        /// Sessions run at once by one worker process.
        pub concurrency: usize = 256,
        pub queues: Vec<String> = vec!["default".to_string()],
        /// How long a worker's liveness row (and with it the lease of every session it
        /// runs) lasts without a heartbeat.
        pub lease_ttl_secs: Secs = Secs(1.5),
        pub heartbeat_secs: Secs = Secs(0.5),
        /// Entries idle this long in another consumer's pending list are taken over.
        pub reclaim_min_idle_secs: Secs = Secs(6.0),
        /// Between looks for dead workers' sessions and entries.
        pub reclaim_interval_secs: Secs = Secs(0.5),
        /// Deliveries of one entry before it is dead-lettered.
        pub max_attempts: u32 = 5,
        /// How long a SIGTERM'd worker lets running iterations reach a checkpoint.
        pub drain_timeout_secs: Secs = Secs(30.0),
        /// How long one read of the queue waits for entries.
        pub read_block_ms: u64 = 2_000,
        pub workspace_root: PathBuf = PathBuf::from("./agentq-workspaces"),
        /// Provider of sessions that name none; `None`: the one the environment configures
        /// ([`Settings::default_provider`](super::Settings::default_provider)).
        pub default_provider: Option<String> = None,
        pub default_model: Option<String> = None,
        /// Tools of sessions that name none; `None` means the agent's read-only set.
        pub default_tools: Option<Vec<String>> = None,
        pub shell_enabled: bool = false,
        /// Let http tools reach private and loopback addresses.
        pub allow_private_network: bool = false,
        pub allowed_hosts: Vec<String> = Vec::new(),
        /// Largest file a tool may write (`write_file`, the result of `edit_file`), in bytes.
        pub max_file_bytes: u64 = agentq_agent::tools::DEFAULT_MAX_FILE_BYTES,
        /// Most bytes the files of one workspace (a session tree's directory) may hold,
        /// checked before every write of a file tool.
        pub workspace_quota_bytes: u64 = agentq_agent::tools::DEFAULT_WORKSPACE_QUOTA_BYTES,
        /// Folders of skills (each subfolder with a `SKILL.md` is one), offered to
        /// sessions through the `load_skill` tool.
        pub skills_dirs: Vec<PathBuf> = Vec::new(),
        /// Tools that need approval in every session, on top of each session's own list.
        pub sensitive_tools: Vec<String> = Vec::new(),
        /// How long a finished session's event stream is kept.
        pub event_ttl_secs: Secs = Secs(86_400.0),
        /// Deepest sub-agent nesting (a root session is depth 0).
        pub max_depth: u32 = 3,
        /// Most sub-agents one session may start.
        pub max_children: usize = 16,
        /// Group commit: most checkpoints committed together.
        pub checkpoint_batch_max: usize = 256,
        /// Group commit: commits in flight at once.
        pub checkpoint_writers: usize = 2,
        /// How long the checkpoint of a response whose calls have no effect anywhere may
        /// wait to be committed together with their results; 0 commits every response
        /// first.
        pub write_ahead_grace_ms: u64 = u64::try_from(
            agentq_agent::driver::DEFAULT_WRITE_AHEAD_GRACE.as_millis(),
        )
        .unwrap_or(u64::MAX),
        /// Retries of an LLM call after real failures (5xx, transport, undecodable
        /// answers) for sessions whose spec sets none. Rate-limit waits never count.
        pub max_llm_retries: u32 = agentq_agent::spec::DEFAULT_MAX_LLM_RETRIES,
        /// A session whose next LLM call would wait longer than this for a rate limit
        /// gives up its slot and waits suspended; 0 never suspends.
        pub rate_limit_suspend_secs: Secs = Secs(
            agentq_agent::driver::DEFAULT_SUSPEND_AFTER.as_secs_f64(),
        ),
    }
}
