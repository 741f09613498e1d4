//! Settlements of tenant holds that the store failed ([`Settlements`]), tried again in the
//! background until they count or the hold expires. A failed settlement left the call's
//! worst case held on its tenant's budgets for the hold's whole lifetime (the tenant's
//! other calls waited on it) and its spend out of the budget; a settlement tried again
//! blindly could count the spend twice, since the failed one may have committed before
//! its answer was lost. So a retry settles only while the hold is still stored
//! ([`agentq_core::budget::BudgetStore::settle_tenant_hold_if_held`]), and stops at the
//! hold's expiry, after which a recount may have dropped it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error};

use agentq_core::Store;
use agentq_core::budget::Spend;
use agentq_core::metrics::Metrics;

use crate::backoff::Backoff;

/// Settlements waiting for a retry at most; one more is given up at once (a store down
/// long enough to fill it loses the rest to their holds' expiry anyway).
const PENDING_MAX: usize = 10_000;

/// How long a stopping worker tries its pending settlements once more, in all.
const STOP_BOUND: Duration = Duration::from_secs(3);

/// A hold's settlement that failed, to try again.
pub(crate) struct Pending {
    pub hold: String,
    pub tenant: String,
    pub day: String,
    pub spend: Spend,
    /// When the hold may be gone by expiry; the worker's clock runs ahead of this by a
    /// margin, so that a database clock somewhat ahead of it does not drop the hold first.
    pub until: Instant,
}

/// The worker's queue of settlements to try again, read by [`retry_loop`].
pub(crate) struct Settlements {
    tx: mpsc::Sender<Pending>,
    rx: Mutex<Option<mpsc::Receiver<Pending>>>,
}

impl Settlements {
    pub(crate) fn new() -> Self {
        let (tx, rx) = mpsc::channel(PENDING_MAX);
        Settlements {
            tx,
            rx: Mutex::new(Some(rx)),
        }
    }

    /// Queue `p` for a retry; a full queue gives it up (counted and logged).
    pub(crate) fn retry(&self, metrics: &Metrics, p: Pending) {
        if let Err(e) = self.tx.try_send(p) {
            let p = match e {
                mpsc::error::TrySendError::Full(p) | mpsc::error::TrySendError::Closed(p) => p,
            };
            lost(metrics, &p, "too many settlements are waiting for a retry");
        }
    }

    /// The queue's reading end, for [`retry_loop`]; `None` once taken.
    pub(crate) fn take_receiver(&self) -> Option<mpsc::Receiver<Pending>> {
        self.rx.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// What the retries use: the worker's store and metrics.
pub(crate) struct Retrier {
    pub store: Arc<dyn Store>,
    pub metrics: &'static Metrics,
}

/// Try the queued settlements again, oldest first (a store that fails one fails the
/// next), backing off while the store fails, until `stop`; then try the one in hand and
/// each left once more within [`STOP_BOUND`].
pub(crate) async fn retry_loop(
    r: Retrier,
    mut rx: mpsc::Receiver<Pending>,
    stop: CancellationToken,
) {
    let mut backoff = Backoff::new();
    // The settlement the store failed last, tried again before the next one.
    let mut failing: Option<Pending> = None;
    loop {
        let p = match failing.take() {
            Some(p) => p,
            None => tokio::select! {
                p = rx.recv() => match p { Some(p) => p, None => return },
                _ = stop.cancelled() => break,
            },
        };
        if Instant::now() >= p.until {
            lost(r.metrics, &p, "the hold expired before the store came back");
            continue;
        }
        match try_once(&r, &p).await {
            Ok(()) => backoff.reset(),
            Err(e) => {
                let wait = backoff.next();
                debug!(error = %e, ?wait, hold = %p.hold, "a settlement failed again");
                failing = Some(p);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = stop.cancelled() => break,
                }
            }
        }
    }
    rx.close();
    let rest = failing
        .into_iter()
        .chain(std::iter::from_fn(|| rx.try_recv().ok()))
        .collect();
    last_tries(&r, rest).await;
}

/// A stopping worker's one more try of each settlement left, within [`STOP_BOUND`].
async fn last_tries(r: &Retrier, rest: Vec<Pending>) {
    let deadline = Instant::now() + STOP_BOUND;
    for p in rest {
        let failed = match tokio::time::timeout_at(deadline, try_once(r, &p)).await {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e.to_string(),
            Err(_) => "the worker stopped".to_string(),
        };
        lost(r.metrics, &p, &failed);
    }
}

/// One try of `p`: counted by its outcome when the store answers.
async fn try_once(r: &Retrier, p: &Pending) -> agentq_core::Result<()> {
    let settled = r
        .store
        .settle_tenant_hold_if_held(&p.hold, &p.tenant, &p.day, p.spend)
        .await?;
    let outcome = if settled { "settled" } else { "already" };
    r.metrics
        .tenant_settlements_retried
        .with_label_values(&[outcome])
        .inc();
    Ok(())
}

fn lost(metrics: &Metrics, p: &Pending, why: &str) {
    metrics
        .tenant_settlements_retried
        .with_label_values(&["lost"])
        .inc();
    error!(
        tenant = %p.tenant,
        hold = %p.hold,
        tokens = p.spend.tokens,
        cost_nanos = p.spend.cost_nanos,
        "a call's spend is not counted in its tenant's budget: {why}"
    );
}
