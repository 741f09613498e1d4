//! The integration tests of this crate in one binary: one link and one copy of the
//! shared helpers instead of one per file, and one private Postgres and Redis for
//! them all (`scripts/test -p CRATE --test it FILTER` runs some). A file that must be
//! alone in its process (it measures the process's memory, say) stays a binary of its
//! own beside this directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod api;
mod approvals;
mod auth;
mod batches;
mod body_limits;
mod budgets;
mod dispatch;
mod events;
mod files;
mod forks;
mod hostile_input;
mod limits;
mod mcp;
mod openapi;
mod policy;
mod reports;
mod request_prop;
mod retention;
mod retention_api;
mod schedules;
mod settling;
mod waits;
mod webhooks;
mod workspace_gc;
