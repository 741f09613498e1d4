//! Configuration: an optional `agentq.toml` overlaid by the environment
//! (`AGENTQ_DATABASE_URL`, `AGENTQ_REDIS_URL`, `AGENTQ_API_ADDR`, provider variables).
//! (Filled in with the processes.)
