//! The query of `GET /v1/sessions`, and how much one page may hold.

use std::collections::BTreeMap;

use crate::error::ApiError;
use crate::http::MAX_ID_LEN;

/// The most bytes of sessions (their prompts, systems, results and errors) one page of
/// `GET /v1/sessions` holds: past it the page ends early, with a cursor to the rest, so a
/// listing costs a bounded amount of memory however large the sessions are.
pub const LIST_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Query of `GET /v1/sessions` (the parameters of [`agentq_api::LIST_PARAMS`]): all
/// strings, parsed by hand so each error names its parameter. An empty one is absent.
#[derive(Debug, Default)]
pub struct ListQuery {
    pub status: Option<String>,
    pub limit: Option<String>,
    pub cursor: Option<String>,
    pub parent_id: Option<String>,
    pub batch_id: Option<String>,
}

impl ListQuery {
    /// From the query's parameters, already held to [`agentq_api::LIST_PARAMS`].
    pub fn from_params(mut p: BTreeMap<String, String>) -> Result<ListQuery, ApiError> {
        let mut take = |k: &str| p.remove(k).filter(|v| !v.is_empty());
        let q = ListQuery {
            status: take("status"),
            limit: take("limit"),
            cursor: take("cursor"),
            parent_id: take("parent_id"),
            batch_id: take("batch_id"),
        };
        for (field, v, what) in [
            ("cursor", &q.cursor, "is not a session id"),
            ("parent_id", &q.parent_id, "is not a session id"),
            ("batch_id", &q.batch_id, "is not a batch id"),
        ] {
            if v.as_ref().is_some_and(|v| v.len() > MAX_ID_LEN) {
                return Err(ApiError::invalid(field, what));
            }
        }
        Ok(q)
    }
}
