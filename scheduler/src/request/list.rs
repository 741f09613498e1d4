//! The query of `GET /v1/sessions`, and how much one page may hold.

use serde::Deserialize;

use crate::error::ApiError;
use crate::http::body::no_nul;

/// The most bytes of sessions (their prompts, systems, results and errors) one page of
/// `GET /v1/sessions` holds: past it the page ends early, with a cursor to the rest, so a
/// listing costs a bounded amount of memory however large the sessions are.
pub const LIST_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Query of `GET /v1/sessions`: all strings, parsed by hand so each error names its field.
#[derive(Debug, Default, Deserialize)]
pub struct ListQuery {
    pub status: Option<String>,
    pub limit: Option<String>,
    pub cursor: Option<String>,
    pub parent_id: Option<String>,
}

impl ListQuery {
    /// A NUL character in any parameter is a 422 naming it, as in a body.
    pub fn check_text(&self) -> Result<(), ApiError> {
        for (field, v) in [
            ("status", &self.status),
            ("limit", &self.limit),
            ("cursor", &self.cursor),
            ("parent_id", &self.parent_id),
        ] {
            if let Some(v) = v {
                no_nul(field, v)?;
            }
        }
        Ok(())
    }
}
