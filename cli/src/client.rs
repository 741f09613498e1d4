//! The client commands — `agentq submit`, `status`, `cancel`, `sessions`, `approve`,
//! `deny`, `send`, `batch` — over the HTTP API at `AGENTQ_API_URL` (or `api_url` of `agentq.toml`;
//! default `http://127.0.0.1:7700`). Answers are read as the `agentq-api` types the
//! scheduler sends. Session requests are sent as the user wrote them (flags and JSON
//! Lines alike), so that the server, not the client, judges them and names a bad field.
//!
//! `submit --wait` must not miss a completion that happens between the submit and the
//! subscribe, and the session id is only known after the submit: so it subscribes to
//! `agentq:done` (all completions) first and filters by id. Without a Redis URL
//! (`AGENTQ_REDIS_URL`) it polls `GET /v1/sessions/{id}` instead; with one it still polls
//! now and then, because pub/sub drops messages while a connection is down.
//!
//! `api` is the HTTP plumbing the commands share, `show` how they print, `submit` and
//! `wait` the submission and its `--wait`, `batch` a batch's submission and its `--wait`
//! (listed by batch id, with a progress line), `batches` the `agentq batch` commands
//! (batches as objects: `/v1/batches`), `each` the files of `submit --each`,
//! `sessions` the commands that read sessions, `control` those that act on one or on a
//! batch.

pub(crate) mod api;
mod approvals;
mod batch;
mod batches;
mod control;
mod each;
mod sessions;
pub(crate) mod show;
mod submit;
#[cfg(test)]
mod tests;
mod wait;

pub use approvals::{ApprovalsArgs, EXAMPLES as APPROVALS_EXAMPLES, approvals};
pub use batches::{BatchArgs, EXAMPLES as BATCH_EXAMPLES, batch};
pub use control::{CancelArgs, DecideArgs, SendArgs, cancel, decide, send};
pub use sessions::{SessionsArgs, StatusArgs, sessions, status};
pub use submit::{SubmitArgs, submit};
