//! [`ToolSettings`]: what the host lets the built-in tools do (network, shell, sizes),
//! with their defaults.

/// Default of [`ToolSettings::max_file_bytes`]: 10 MiB.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 10 * 1024 * 1024;
/// Default of [`ToolSettings::workspace_quota_bytes`]: 100 MiB.
pub const DEFAULT_WORKSPACE_QUOTA_BYTES: u64 = 100 * 1024 * 1024;

/// Host-level settings tools read (network policy, shell switch, limits).
#[derive(Debug, Clone)]
pub struct ToolSettings {
    /// `http_fetch` may reach private, loopback and link-local addresses.
    pub allow_private_network: bool,
    /// Hosts `http_fetch` may reach even if private (e.g. `127.0.0.1:8080`, `localhost`).
    pub allowed_hosts: Vec<String>,
    /// The `shell` tool exists only when this is on.
    pub shell_enabled: bool,
    pub shell_timeout_secs: u64,
    pub http_max_bytes: usize,
    pub read_max_bytes: usize,
    /// Largest file a tool may write (`write_file`'s content, `edit_file`'s result),
    /// refused before it is built (`worker.max_file_bytes`).
    pub max_file_bytes: u64,
    /// Most bytes the files of one workspace may hold, checked before every write
    /// (`worker.workspace_quota_bytes`).
    pub workspace_quota_bytes: u64,
}

impl Default for ToolSettings {
    fn default() -> Self {
        ToolSettings {
            allow_private_network: false,
            allowed_hosts: Vec::new(),
            shell_enabled: false,
            shell_timeout_secs: 60,
            http_max_bytes: 1_000_000,
            read_max_bytes: 1_000_000,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            workspace_quota_bytes: DEFAULT_WORKSPACE_QUOTA_BYTES,
        }
    }
}
