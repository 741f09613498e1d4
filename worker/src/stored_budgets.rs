//! The tenant budgets stored through the admin API, as this worker last read them: a
//! short-lived copy every LLM call of the worker consults, so that a budget raised there
//! binds every worker within [`STORED_BUDGETS_TTL`] without a read per call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Mutex;
use tracing::warn;

use agentq_core::Store;
use agentq_core::budget::TenantBudget;

/// How long a worker trusts the budgets it read from the store: a budget raised through
/// the admin API binds every worker within this.
const STORED_BUDGETS_TTL: Duration = Duration::from_secs(2);

/// The tenant budgets stored through the admin API, read at most every
/// [`STORED_BUDGETS_TTL`] per worker. Every LLM call of the worker looks here, so a fresh
/// copy is one uncontended lock; when it is stale, one caller reads the store while the
/// others wait for that read rather than each making their own.
#[derive(Default)]
pub(crate) struct StoredBudgets {
    cache: std::sync::Mutex<Option<(Instant, Arc<Vec<TenantBudget>>)>>,
    refresh: Mutex<()>,
}

impl StoredBudgets {
    fn fresh(&self) -> Option<Arc<Vec<TenantBudget>>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .as_ref()
            .filter(|(at, _)| at.elapsed() < STORED_BUDGETS_TTL)
            .map(|(_, b)| b.clone())
    }

    /// Read the stored budgets again at the next use.
    pub(crate) fn forget(&self) {
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    pub(crate) async fn get(&self, store: &dyn Store) -> Option<Arc<Vec<TenantBudget>>> {
        if let Some(b) = self.fresh() {
            return Some(b);
        }
        let _one = self.refresh.lock().await;
        // Read by the caller that held the refresh before this one.
        if let Some(b) = self.fresh() {
            return Some(b);
        }
        match store.tenant_budgets().await {
            Ok(b) => {
                let b = Arc::new(b);
                *self.cache.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some((Instant::now(), b.clone()));
                Some(b)
            }
            Err(e) => {
                warn!(error = %e, "reading the stored tenant budgets failed");
                None
            }
        }
    }
}
