//! The workspace a checked session request starts from, where the store is needed: its
//! `workspace_from` names a session of the caller's own tenant ([`check_sources`]), and
//! its files bind the idempotency hash by their digest ([`files_digest`]).

use agentq_core::auth::Caller;
use agentq_core::workspace::InputFile;

use crate::error::ApiError;
use crate::http::body::path;
use crate::request::SessionRequest;
use crate::state::Scheduler;

/// Every `workspace_from` of `reqs` names a session of the caller's own tenant (`batch`:
/// the field is named by the item's index). See [`Sources::check`].
pub async fn check_sources(
    s: &Scheduler,
    caller: &Caller,
    reqs: &[SessionRequest],
    batch: bool,
) -> Result<(), ApiError> {
    // A batch may fork many sessions from a few sources: each is looked up once.
    let mut seen = Sources::default();
    for (i, r) in reqs.iter().enumerate() {
        let prefix = if batch {
            format!("[{i}]")
        } else {
            String::new()
        };
        seen.check(s, caller, r, &prefix).await?;
    }
    Ok(())
}

/// The `workspace_from` sessions one request's items named, each looked up once.
#[derive(Debug, Default)]
pub struct Sources {
    found: std::collections::HashMap<String, bool>,
}

impl Sources {
    /// `r`'s `workspace_from`, if any, names a session of the caller's own tenant
    /// (`prefix` names the item). Another tenant's session is refused exactly like one
    /// that does not exist, so that ids of other tenants cannot be probed; the operator's
    /// key, which reads every tenant, still only forks into its own.
    pub async fn check(
        &mut self,
        s: &Scheduler,
        caller: &Caller,
        r: &SessionRequest,
        prefix: &str,
    ) -> Result<(), ApiError> {
        let Some(id) = &r.workspace_from else {
            return Ok(());
        };
        let found = match self.found.get(id.as_str()) {
            Some(found) => *found,
            None => {
                let found = s
                    .store
                    .get(id)
                    .await?
                    .is_some_and(|row| row.tenant == caller.tenant);
                self.found.insert(id.clone(), found);
                found
            }
        };
        if !found {
            return Err(ApiError::Invalid {
                code: "not_found",
                field: Some(path(prefix, "workspace_from")),
                message: format!("session {id} not found"),
            });
        }
        Ok(())
    }
}

/// What the idempotency hash of a request with files binds them by: each path and the
/// SHA-256 of its bytes, in order.
pub fn files_digest(files: &[InputFile]) -> Vec<(&str, String)> {
    use sha2::{Digest, Sha256};
    files
        .iter()
        .map(|f| {
            let d = Sha256::digest(&f.data);
            let hex: String = d.iter().map(|b| format!("{b:02x}")).collect();
            (f.path.as_str(), hex)
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_binds_paths_and_bytes() {
        let a = vec![InputFile {
            path: "a".into(),
            data: b"1".to_vec(),
        }];
        let b = vec![InputFile {
            path: "a".into(),
            data: b"2".to_vec(),
        }];
        assert_ne!(files_digest(&a), files_digest(&b));
        assert_eq!(files_digest(&a), files_digest(&a.clone()));
    }
}
