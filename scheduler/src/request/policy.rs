//! A decoded request held to its tenant's policy, through the one check the worker runs
//! again on the stored row ([`TenantPolicy::check_request`]).

use agentq_core::policy::{Sent, SpawnContext, TenantPolicy};

use crate::error::ApiError;
use crate::http::body::path;

use super::item::SessionRequest;

/// Hold a request to its tenant's policy (`prefix` names it inside a batch): a value
/// beyond it is refused naming the field; a default above a bound is lowered to it.
pub fn check_policy(
    req: &mut SessionRequest,
    policy: &TenantPolicy,
    prefix: &str,
) -> Result<(), ApiError> {
    policy
        .check_request(
            &req.queue,
            &mut req.spec,
            Sent::Fields(&req.sent),
            SpawnContext::default(),
        )
        .map_err(|v| ApiError::invalid(path(prefix, &v.field), v.message))
}

/// [`check_policy`] for every item of a batch, each named by its index (`[3].base_url`).
pub fn check_policy_batch(
    reqs: &mut [SessionRequest],
    policy: &TenantPolicy,
) -> Result<(), ApiError> {
    for (i, req) in reqs.iter_mut().enumerate() {
        check_policy(req, policy, &format!("[{i}]"))?;
    }
    Ok(())
}
