//! The integration tests of this crate in one binary: one link and one copy of the
//! shared helpers instead of one per file, and one private Postgres and Redis for
//! them all (`scripts/test -p CRATE --test it FILTER` runs some). A file that must be
//! alone in its process (it measures the process's memory, say) stays a binary of its
//! own beside this directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../support/mod.rs"]
mod support;

mod admission;
mod agent_loop;
mod anthropic;
mod guardian;
mod openai;
mod provider_keys;
mod sse_prop;
mod state;
mod tools;
mod transport;
mod web_search;
