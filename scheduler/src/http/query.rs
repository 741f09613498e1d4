//! Query strings: a route names the parameters it reads, and anything else is refused
//! (422 `unknown_field` naming the parameter) rather than ignored, so a misspelt filter
//! (`?batch=` for `?batch_id=`) never widens what a listing or an action reaches.

use std::collections::BTreeMap;

use axum::extract::Query;
use axum::extract::rejection::QueryRejection;

use super::body::no_nul;
use crate::error::ApiError;

/// The query's parameters by name: each one of `known`, given once, without a NUL.
pub fn params(
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
    known: &[&str],
) -> Result<BTreeMap<String, String>, ApiError> {
    params_of(pairs(query)?, known)
}

/// The query's parameters in order, repeats included.
pub fn pairs(
    query: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Vec<(String, String)>, ApiError> {
    let Query(pairs) = query.map_err(|e| ApiError::InvalidQuery(e.body_text()))?;
    Ok(pairs)
}

/// [`params`] of pairs already read (a route that takes a repeatable parameter out
/// first).
pub fn params_of(
    pairs: Vec<(String, String)>,
    known: &[&str],
) -> Result<BTreeMap<String, String>, ApiError> {
    let mut out = BTreeMap::new();
    for (name, value) in pairs {
        if !known.contains(&name.as_str()) {
            let shown = if name.is_empty() { "\"\"" } else { &name };
            return Err(ApiError::Invalid {
                code: "unknown_field",
                field: Some(shown.to_string()),
                message: format!(
                    "unknown query parameter `{shown}` (expected one of {})",
                    known.join(", ")
                ),
            });
        }
        no_nul(&name, &value)?;
        if out.contains_key(&name) {
            return Err(ApiError::invalid(name, "is given more than once"));
        }
        out.insert(name, value);
    }
    Ok(out)
}
