//! agentq-types: the domain, without I/O. The session model and batches, the cross-process protocol,
//! what a session waits for, scheduling, API keys and callers, the operator's policy,
//! budget arithmetic, workspace types and path rules, the limiter's state as the admin
//! view reads it, and the settings tree with its validation. No database, Redis, object
//! store or metrics code depends on it being here: the backends (`agentq-store`,
//! `agentq-queue`, `agentq-limiter`) build on it, and `agentq-api` needs nothing else.

pub mod auth;
pub mod batch;
pub mod budget;
pub mod config;
pub mod error;
pub mod fork;
pub mod limiter;
pub mod model;
pub mod policy;
pub mod protocol;
pub mod report;
pub mod retention;
pub mod schedule;
pub mod scheduling;
pub mod shard;
pub mod wait;
pub mod webhook;
pub mod workspace;
pub mod workspace_path;

pub use error::{Error, Result};
