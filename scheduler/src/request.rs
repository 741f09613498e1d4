//! What a client may send to create sessions: a body's bytes to [`SessionRequest`]s,
//! every check of them, and the query of `GET /v1/sessions`. Everything here runs before
//! anything is written, so a rejected request (or a batch with one bad item) leaves no
//! trace.
//!
//! A body is an [`agentq_api::CreateSession`] (a batch: a JSON array of them). Before,
//! one request took six shapes and its spec was checked in five places across four
//! crates: bytes → scan → `Value` → a hand walk taking `queue`, `idempotency_key`,
//! `priority`, `workspace_from` and `files` out of the `Value` by matching its variants
//! (with the typed `CreateSession` used only as a list of field names) → `SessionSpec`
//! → `SessionRequest` → `NewSession`, the spec held to `SessionSpec::validate` (agent),
//! a host check here, `bounds::check_spec` (api), the queue check and
//! `TenantPolicy::apply` (types), and the worker holding the stored row to the last two
//! again by hand. Now:
//!
//! 1. bytes → `http::body::scan` (400 on a syntax error; a NUL character,
//!    a repeated key or an oversize object anywhere is a 422 naming it), then each item
//!    (the body, or one batch item at a time: `batch`) is read as a JSON object;
//! 2. the checks before any value is decoded (`guard`): unknown field refused; a field
//!    named like a credential refused with its own code; `metadata`'s keys, type and
//!    size;
//! 3. the typed decode, field by field in the API's order, each failure a 422 naming its
//!    field through `serde_path_to_error` (batch items prefixed `[i].`): the envelope
//!    (`envelope`: `queue`, `idempotency_key`, `priority`), then the size of `prompt`
//!    and `system` (a 413 even when another field is also wrong) and `prompt`'s
//!    presence, `workspace_from`, the [`SessionSpec`](agentq_agent::spec::SessionSpec)
//!    from the fields left, and `files` (`files`) last;
//! 4. the spec's one shape check, `agentq_types::policy::request::check_spec`;
//! 5. in the route, after the idempotency hash is taken: the tenant's policy
//!    ([`check_policy`]), through `TenantPolicy::check_request`, the same check the
//!    worker's `check_stored` runs on the stored row (with `Sent::Stored`) before it runs it.
//!
//! The result is a [`SessionRequest`] (the typed request, files normalised), which the
//! route turns into the store's `NewSession`. An item of a batch object (`POST
//! /v1/batches`) is one such request with its `custom_id` taken out first
//! (`batch_item`), named `requests[3]` or `line 17`.

mod batch;
mod batch_item;
mod envelope;
mod files;
mod guard;
mod item;
mod list;
mod policy;

pub use batch::{parse_batch, parse_batch_bytes};
pub use batch_item::{BatchOptions, parse_batch_item};
pub use envelope::{MAX_IDEMPOTENCY_KEY, MAX_QUEUE_NAME, valid_queue_name};
pub use guard::MAX_METADATA_BYTES;
pub use item::{DEFAULT_QUEUE, Limits, SessionRequest, parse_session};
pub use list::{LIST_MAX_BYTES, ListQuery, RowFilter};
pub use policy::{check_policy, check_policy_batch};

pub use crate::http::body::{decode_json, decode_object};
pub use crate::http::{JsonBody, RawJson};

#[cfg(test)]
#[path = "request/tests.rs"]
mod tests;
