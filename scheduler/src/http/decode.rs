//! The batch decode budget: how many bytes of `POST /v1/sessions/batch` bodies are read
//! and decoded at once across all requests (`batch_decode_bytes`); the extractor that
//! reads a batch's body under it is `BatchBody` (`http::batch_body`).
//!
//! A batch takes about four times its body while it is created (the body, the requests
//! parsed from it, the statement's arguments and the rows it answers), so concurrent
//! batches multiply that: five 32 MB batches at once took the process to 585 MB. Each
//! body's bytes are granted from the budget before they are buffered (the declared
//! `Content-Length` at once; a body without one as it arrives) and held until its
//! handler returns. A body the budget has no room for now is answered 503 with
//! `Retry-After` at once, never queued: a request waiting would hold its connection and
//! its client, and a client can retry after others' batches are done. One tenant holds
//! at most half the budget, so a caller with a key that trickles its bodies (each held
//! until `body_read_timeout`) leaves the other half to everyone else; a body larger than
//! that half is a 413 naming the setting, as no retry could succeed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// Seconds a batch refused for the budget is told to wait.
const RETRY_AFTER_SECS: u64 = 1;

/// The budget (see the module docs). Cheap to clone (shared).
#[derive(Debug, Clone)]
pub(crate) struct DecodeBudget {
    /// Bytes one tenant may hold at once: half the budget.
    share: usize,
    permits: Arc<Semaphore>,
    tenants: Arc<Mutex<HashMap<String, usize>>>,
}

impl DecodeBudget {
    pub(crate) fn new(total: usize) -> Self {
        let total = total.clamp(2, Semaphore::MAX_PERMITS);
        DecodeBudget {
            share: total / 2,
            permits: Arc::new(Semaphore::new(total)),
            tenants: Arc::default(),
        }
    }

    pub(crate) fn grant(&self, tenant: &str) -> Grant {
        Grant {
            budget: self.clone(),
            tenant: tenant.to_string(),
            held: 0,
            permit: None,
        }
    }
}

/// The bytes of the budget one request holds; given back when dropped.
#[derive(Debug)]
pub struct Grant {
    budget: DecodeBudget,
    tenant: String,
    pub(crate) held: usize,
    permit: Option<OwnedSemaphorePermit>,
}

impl Grant {
    /// Hold `n` more bytes, or a 503 (no room now) or a 413 (never room).
    pub(crate) fn take(&mut self, n: usize) -> Result<(), ApiError> {
        if n == 0 {
            return Ok(());
        }
        let share = self.budget.share;
        let want = self.held.saturating_add(n);
        if want > share {
            return Err(ApiError::TooLarge {
                field: None,
                message: format!(
                    "a batch body of more than {share} bytes is not read: one tenant's \
                     batches decode at most half of scheduler.batch_decode_bytes at once"
                ),
            });
        }
        let busy = |whose: &str| ApiError::Overloaded {
            message: format!(
                "{whose} being decoded fill the decode budget \
                 (scheduler.batch_decode_bytes); retry later"
            ),
            retry_after: RETRY_AFTER_SECS,
        };
        let mut tenants = self
            .budget
            .tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let of_tenant = tenants.get(&self.tenant).copied().unwrap_or(0);
        if of_tenant.saturating_add(n) > share {
            return Err(busy("this tenant's batches"));
        }
        // `want` is at most `share`, itself at most `Semaphore::MAX_PERMITS`.
        let count = u32::try_from(n).map_err(|_| busy("batches"))?;
        let permit = self
            .budget
            .permits
            .clone()
            .try_acquire_many_owned(count)
            .map_err(|_| busy("other batches"))?;
        match &mut self.permit {
            Some(p) => p.merge(permit),
            None => self.permit = Some(permit),
        }
        self.held = want;
        *tenants.entry(self.tenant.clone()).or_default() = of_tenant.saturating_add(n);
        Ok(())
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.held == 0 {
            return;
        }
        let mut tenants = self
            .budget
            .tenants
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = tenants.get_mut(&self.tenant) {
            *n = n.saturating_sub(self.held);
            if *n == 0 {
                tenants.remove(&self.tenant);
            }
        }
    }
}
