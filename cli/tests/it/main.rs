//! The integration tests of this crate in one binary: one link and one copy of the
//! shared helpers instead of one per file, and one private Postgres and Redis for
//! them all (`scripts/test -p CRATE --test it FILTER` runs some). A file that must be
//! alone in its process (it measures the process's memory, say) stays a binary of its
//! own beside this directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod approvals_cli;
mod batch_cli;
mod batches_cli;
mod bench;
mod client_cli;
mod clients;
mod console;
mod demo;
mod dev_workspace;
mod files_cli;
mod first_hour;
mod guide;
mod keys_cli;
mod openapi;
mod process_lines;
mod provider_keys;
mod retention_cli;
mod run_cli;
mod shell_parent_env;
mod tools_cli;
mod webhooks_dev;
