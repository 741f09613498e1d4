//! The integration tests of this crate in one binary: one link and one copy of the
//! shared helpers instead of one per file, and one private Postgres and Redis for
//! them all (`scripts/test -p CRATE --test it FILTER` runs some). A file that must be
//! alone in its process (it measures the process's memory, say) stays a binary of its
//! own beside this directory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../common/mod.rs"]
mod common;

mod pg_store;
mod schema_parity;
mod shard_map;
mod sqlite_faults;
mod value_rules;
