//! The caps on open event streams, in all, per tenant and per API key: a stream holds a
//! [`StreamPermit`] for as long as it is open, and one past a cap is refused with a 503
//! and `Retry-After` before anything is read for it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use agentq_core::auth::Caller;

use crate::error::ApiError;

/// Seconds a refused client is told to wait: streams are long-lived, one frees up only
/// when a client goes away or a session ends.
const RETRY_AFTER_SECS: u64 = 5;

/// How many streams may be open at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    pub total: usize,
    pub per_tenant: usize,
    pub per_key: usize,
}

/// The open streams of this scheduler. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub(crate) struct StreamCaps {
    limits: StreamLimits,
    open: Arc<Mutex<Open>>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    tenants: HashMap<String, usize>,
    keys: HashMap<String, usize>,
}

/// One open stream; dropping it closes it.
#[derive(Debug)]
pub(crate) struct StreamPermit {
    open: Arc<Mutex<Open>>,
    tenant: String,
    key: Option<String>,
}

impl StreamCaps {
    pub(crate) fn new(limits: StreamLimits) -> Self {
        StreamCaps {
            limits,
            open: Arc::default(),
        }
    }

    /// A permit for one more stream of `caller`, or a 503 naming the cap reached.
    pub(crate) fn acquire(&self, caller: &Caller) -> Result<StreamPermit, ApiError> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let full = |what: &str, n: usize| ApiError::Overloaded {
            message: format!("too many open event streams {what} (at most {n}); retry later"),
            retry_after: RETRY_AFTER_SECS,
        };
        if open.total >= self.limits.total {
            return Err(full("on this server", self.limits.total));
        }
        if open.tenants.get(&caller.tenant).copied().unwrap_or(0) >= self.limits.per_tenant {
            return Err(full("for this tenant", self.limits.per_tenant));
        }
        if let Some(key) = &caller.key_id
            && open.keys.get(key).copied().unwrap_or(0) >= self.limits.per_key
        {
            return Err(full("for this API key", self.limits.per_key));
        }
        open.total += 1;
        *open.tenants.entry(caller.tenant.clone()).or_default() += 1;
        if let Some(key) = &caller.key_id {
            *open.keys.entry(key.clone()).or_default() += 1;
        }
        Ok(StreamPermit {
            open: self.open.clone(),
            tenant: caller.tenant.clone(),
            key: caller.key_id.clone(),
        })
    }
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total = open.total.saturating_sub(1);
        release(&mut open.tenants, &self.tenant);
        if let Some(key) = &self.key {
            release(&mut open.keys, key);
        }
    }
}

/// One fewer open for `name`, forgetting it at zero (so a map holds only what is open).
/// Shared with the listener's per-key connection counts.
pub(crate) fn release(counts: &mut HashMap<String, usize>, name: &str) {
    if let Some(n) = counts.get_mut(name) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            counts.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn caller(tenant: &str, key: Option<&str>) -> Caller {
        Caller {
            tenant: tenant.into(),
            scopes: Vec::new(),
            key_id: key.map(str::to_string),
        }
    }

    #[test]
    fn caps_count_open_streams_and_free_them_on_drop() {
        let caps = StreamCaps::new(StreamLimits {
            total: 4,
            per_tenant: 2,
            per_key: 1,
        });
        let a1 = caps.acquire(&caller("a", Some("k1"))).unwrap();
        // The same key again: its cap is 1.
        let e = caps.acquire(&caller("a", Some("k1"))).unwrap_err();
        assert!(e.to_string().contains("API key"), "{e}");
        let a2 = caps.acquire(&caller("a", Some("k2"))).unwrap();
        let e = caps.acquire(&caller("a", Some("k3"))).unwrap_err();
        assert!(e.to_string().contains("tenant"), "{e}");
        let _b1 = caps.acquire(&caller("b", None)).unwrap();
        let _b2 = caps.acquire(&caller("b", None)).unwrap();
        let e = caps.acquire(&caller("c", None)).unwrap_err();
        assert!(e.to_string().contains("server"), "{e}");
        drop(a1);
        drop(a2);
        let _a = caps.acquire(&caller("a", Some("k1"))).unwrap();
        assert_eq!(caps.open.lock().unwrap().keys.len(), 1);
    }
}
