//! Batches as objects of the API (`/v1/batches`), built on what a batch of sessions
//! already was: its id is the `batch_id` its sessions carry, its items are session
//! requests checked as `POST /v1/sessions` checks one, its cap is the dispatcher's
//! per-batch `max_running`, and it is scoped by tenant like a session.
//!
//! Creating one takes two passes, so that a batch of any size is never whole in memory
//! and the store's transaction never waits on the client: `upload` reads the body (a JSON
//! object, or JSON Lines as a stream: `lines`) and checks every item into a temporary
//! file (`spool`); `create` then reads that file back a chunk at a time into the store's
//! one transaction, and enqueues what the dispatcher does not hold. What a batch did is
//! counted from its sessions when it is read (`read`): nothing is written to the batch as
//! they run.

mod create;
mod lines;
mod read;
mod spool;
mod upload;

pub(crate) use create::create;
pub(crate) use read::{ResultsPage, batch_of, cancel, list, results, view_of};
pub use upload::MAX_UPLOAD_BYTES;
pub(crate) use upload::{json_body, json_lines};
