//! The budget gate every LLM call of a session passes before the rate limiter: its tree's
//! token budget (its allowance minus its own spend, what its live sub-agents hold and what
//! its finished ones spent, read from the store's ledger before each call, so a sibling's
//! or a child's spend on another worker counts at once) and its tenant's budgets per day
//! or month. After each call it counts the tenant's tokens and cost (metrics, and the
//! store's daily spend for tenants with a budget).
//!
//! A call starts only when what is left pays for its worst case, and the allowances of a
//! tree's sessions are disjoint (each drawn from its parent's), so a tree ends within its
//! budget plus what the estimates of the calls in flight missed. A call of a tenant with a
//! budget holds its worst case on the tenant's budgets while it runs, and starts only
//! while the tenant's spend and the other calls' holds are below them, so a tenant ends
//! within its budget plus one call, however many of its sessions run at once. A call that
//! finds the budget taken only by the other calls' holds waits for them to settle (they
//! may spend far less than they hold): only a spend that has reached the budget ends or
//! parks a session.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use tokio::time::Instant;
use tracing::warn;

use agentq_agent::driver::{Admission, Admit, CallAsk, CallReport, Permit};
use agentq_agent::schema::Usage;
use agentq_core::SessionRow;
use agentq_core::budget::{OnBudget, Spend, TenantBudget, TenantHold, day_key};

use crate::inner::Inner;
use crate::settlements::Pending;

/// How long a call waits when the store cannot say what is left: a budget is not
/// enforced by guessing.
const STORE_DOWN_WAIT: Duration = Duration::from_secs(1);

/// How long a call's hold on its tenant's budgets lasts at most: what a worker that died
/// during the call leaves held. Longer than calls last in practice; one that runs longer
/// still is counted when it ends, but holds nothing for its remaining time.
const HOLD_TTL: Duration = Duration::from_secs(30 * 60);

/// How much sooner than the database a worker takes a hold to have expired, when it stops
/// trying a failed settlement again: the two clocks may differ by this much.
const CLOCK_MARGIN: Duration = Duration::from_secs(60);

/// How often a guardian review whose session's budget is held by the session's running
/// sub-agents looks again (a session itself gives its slot up and waits for them).
const HELD_WAIT: Duration = Duration::from_secs(1);

/// A call that finds its tenant's budget taken by the holds of other calls in flight looks
/// again after this, doubling while it keeps finding them (a call lasts seconds), up to
/// [`HOLDS_WAIT_MAX`], and never past when the first of those holds expires. The driver
/// waits out each look against the session's deadline and its cancellation.
const HOLDS_WAIT_MIN: Duration = Duration::from_millis(50);
const HOLDS_WAIT_MAX: Duration = Duration::from_secs(1);

/// The wait reason of a call waiting for the holds of its tenant's other calls.
pub(crate) const HOLDS_REASON: &str = "budget_holds";

/// The budgets that bind `tenant`: the one stored through the admin API if there is one,
/// else the configured ones. `None` when the store could not be read.
pub(crate) async fn tenant_budgets(inner: &Inner, tenant: &str) -> Option<Vec<TenantBudget>> {
    let stored = inner.stored_budgets.get(inner.store.as_ref()).await?;
    if let Some(b) = stored.iter().find(|b| b.tenant == tenant) {
        return Some(vec![b.clone()]);
    }
    Some(
        inner
            .cfg
            .budgets
            .iter()
            .filter(|b| b.tenant == tenant)
            .cloned()
            .collect(),
    )
}

/// The gate of one session: the budgets, then `next` (the rate limiter).
pub(crate) struct BudgetGate {
    inner: Arc<Inner>,
    session_id: String,
    tenant: String,
    /// The session's allowance when its row stores none (a root: its spec's budget).
    allowance: Option<u64>,
    /// Its own spend as this run knows it (newer than the store's between checkpoints),
    /// shared with its [`BudgetGate::sibling`].
    own: Arc<AtomicU64>,
    /// The hold of the call in flight on the tenant's budgets (a session makes one call
    /// at a time), settled with it, and until when a failed settlement is tried again.
    hold: std::sync::Mutex<Option<(String, Instant)>>,
    /// How many looks in a row found the tenant's budget taken by other calls' holds.
    holds_waits: AtomicU32,
    next: Arc<dyn Admission>,
}

impl BudgetGate {
    pub(crate) fn new(
        inner: Arc<Inner>,
        row: &SessionRow,
        allowance: Option<u64>,
        next: Arc<dyn Admission>,
    ) -> Self {
        BudgetGate {
            inner,
            session_id: row.id.clone(),
            tenant: row.tenant.clone(),
            allowance,
            own: Arc::new(AtomicU64::new(row.usage.total())),
            hold: std::sync::Mutex::new(None),
            holds_waits: AtomicU32::new(0),
            next,
        }
    }

    /// The gate of the same session's calls to another provider (its guardian's), in front
    /// of `next`: the same budgets and the same count of the session's spend, so that
    /// each gate's calls count against the other's.
    pub(crate) fn sibling(&self, next: Arc<dyn Admission>) -> BudgetGate {
        BudgetGate {
            inner: self.inner.clone(),
            session_id: self.session_id.clone(),
            tenant: self.tenant.clone(),
            allowance: self.allowance,
            own: self.own.clone(),
            hold: std::sync::Mutex::new(None),
            holds_waits: AtomicU32::new(0),
            next,
        }
    }

    /// This session's spend as its run knows it, shared with its gates: a spawn draws its
    /// child's grant after it (see [`agentq_core::budget::SpawnBudget::parent_spent`]).
    pub(crate) fn spent(&self) -> Arc<AtomicU64> {
        self.own.clone()
    }

    /// The tree budget: the call starts only if what is left pays for its worst case (the
    /// prompt's estimate and all of `max_tokens`), so no session spends past its
    /// allowance by more than the estimate missed.
    async fn tree(&self, ask: &CallAsk<'_>) -> Option<Admit> {
        let allowance = self.allowance?;
        let ledger = match self.inner.store.ledger(&self.session_id).await {
            Ok(Some(l)) => l,
            Ok(None) => return None,
            Err(e) => {
                warn!(error = %e, "reading the tree budget failed; the call waits");
                return Some(Admit::Wait {
                    after: STORE_DOWN_WAIT,
                    reason: "budget",
                });
            }
        };
        let allowance = ledger.allowance.unwrap_or(allowance);
        let own = self.own.load(Ordering::Relaxed);
        let left = ledger.remaining(allowance, own);
        let worst = ask
            .input_tokens
            .saturating_add(ask.max_output_tokens)
            .max(1);
        if left >= worst {
            return None;
        }
        // Running sub-agents hold some of it and give back what they do not spend: wait
        // for them rather than end the session (which would cancel them), away from the
        // worker's slots, which they may need: parents polling here on every slot starved
        // their queued children forever.
        if ledger.held > 0 {
            return Some(Admit::Children { after: HELD_WAIT });
        }
        Some(Admit::Exhausted {
            message: format!(
                "token budget of {allowance} spent: {} by this session, {} by its finished \
                 sub-agents, {} held by running ones; {left} left, and the next call may \
                 cost {worst}",
                own.max(ledger.spent),
                ledger.children_spent,
                ledger.held
            ),
            park: false,
        })
    }

    /// The tenant's budgets: the call holds its worst case on them
    /// ([`agentq_core::budget::BudgetStore::hold_tenant_spend`]) or is refused. A budget
    /// found spent is checked again against freshly read ones, so that a budget raised a
    /// moment ago never parks or fails a session. `None`: the call may start (held, or
    /// the tenant has no budget).
    async fn tenant(&self, ask: &CallAsk<'_>) -> Option<Admit> {
        let refused = self.tenant_with_cache(ask).await;
        if matches!(refused, Some(Admit::Exhausted { .. })) {
            self.inner.stored_budgets.forget();
            return self.tenant_with_cache(ask).await;
        }
        refused
    }

    async fn tenant_with_cache(&self, ask: &CallAsk<'_>) -> Option<Admit> {
        let Some(budgets) = tenant_budgets(&self.inner, &self.tenant).await else {
            return Some(Admit::Wait {
                after: STORE_DOWN_WAIT,
                reason: "budget",
            });
        };
        if budgets.is_empty() {
            return None;
        }
        // Searches are priced per search: a call that may run them holds their price too.
        let worst = Usage {
            input_tokens: ask.input_tokens,
            output_tokens: ask.max_output_tokens,
            web_search_requests: ask.web_searches,
            ..Usage::default()
        };
        let hold = TenantHold {
            id: uuid::Uuid::new_v4().to_string(),
            tenant: self.tenant.clone(),
            worst: Spend {
                tokens: worst.total(),
                cost_nanos: self.inner.cfg.prices.cost_nanos(ask.model, &worst),
            },
            ttl: HOLD_TTL,
        };
        match self
            .inner
            .store
            .hold_tenant_spend(&hold, &budgets, Utc::now())
            .await
        {
            Ok(None) => {
                self.holds_waits.store(0, Ordering::Relaxed);
                let until = Instant::now() + HOLD_TTL.saturating_sub(CLOCK_MARGIN);
                *self.hold.lock().unwrap_or_else(|e| e.into_inner()) = Some((hold.id, until));
                None
            }
            // Reached only with what the other calls hold: they may spend less, so the
            // call waits for them to settle rather than end or park the session.
            Ok(Some(refused)) if refused.holds_expire.is_some() => {
                let looks = self.holds_waits.fetch_add(1, Ordering::Relaxed);
                let backoff = HOLDS_WAIT_MIN
                    .saturating_mul(1u32 << looks.min(8))
                    .min(HOLDS_WAIT_MAX);
                let to_expiry = refused
                    .holds_expire
                    .and_then(|t| (t - Utc::now()).to_std().ok())
                    .unwrap_or_default();
                // Not below the first step: a worker clock ahead of the database's would
                // otherwise ask again at once until the database saw the hold expire.
                Some(Admit::Wait {
                    after: backoff.min(to_expiry.max(HOLDS_WAIT_MIN)),
                    reason: HOLDS_REASON,
                })
            }
            Ok(Some(refused)) => Some(Admit::Exhausted {
                message: refused.message,
                park: budgets
                    .get(refused.budget)
                    .is_some_and(|b| b.on_budget == OnBudget::Park),
            }),
            Err(e) => {
                warn!(error = %e, "holding the tenant's budget failed; the call waits");
                Some(Admit::Wait {
                    after: STORE_DOWN_WAIT,
                    reason: "budget",
                })
            }
        }
    }

    /// Give the hold of a call that will not start back (nothing spent).
    async fn release_hold(&self) {
        let Some(hold) = self.hold.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        self.settle_hold(hold, Spend::default()).await;
    }

    /// The hold becomes what its call spent; a settlement the store fails is tried again
    /// in the background (see [`crate::settlements`]).
    async fn settle_hold(&self, (hold, until): (String, Instant), spend: Spend) {
        let day = day_key(Utc::now().date_naive());
        if let Err(e) = self
            .inner
            .store
            .settle_tenant_hold(&hold, &self.tenant, &day, spend)
            .await
        {
            warn!(error = %e, tenant = %self.tenant, "counting the tenant's spend failed; it is tried again");
            self.inner.settlements.retry(
                self.inner.metrics,
                Pending {
                    hold,
                    tenant: self.tenant.clone(),
                    day,
                    spend,
                    until,
                },
            );
        }
    }
}

#[async_trait]
impl Admission for BudgetGate {
    async fn reserve(&self, ask: &CallAsk<'_>) -> Admit {
        if let Some(refused) = self.tree(ask).await {
            return refused;
        }
        if self.holds_waits.load(Ordering::Relaxed) > 0 {
            // Waiting for other calls' holds: the budget first, so that the rate limiter
            // is asked only once there is room (asking it at every look and giving its
            // reservation back would spend the fleet's rate limit on calls that do not
            // start).
            if let Some(refused) = self.tenant(ask).await {
                return refused;
            }
            return match self.next.reserve(ask).await {
                Admit::Go(permit) => Admit::Go(permit),
                other => {
                    self.release_hold().await;
                    other
                }
            };
        }
        // The rate limiter before the tenant's budgets: a call told to wait for a rate
        // limit (again and again, under a busy limit) holds nothing and costs the store
        // nothing; a call let through holds its worst case until it ends.
        let permit = match self.next.reserve(ask).await {
            Admit::Go(p) => p,
            other => return other,
        };
        if let Some(refused) = self.tenant(ask).await {
            // No call: the limiter's reservation goes back unused.
            self.next.settle(ask, permit, &CallReport::UNSENT).await;
            return refused;
        }
        Admit::Go(permit)
    }

    async fn settle(&self, ask: &CallAsk<'_>, permit: Permit, report: &CallReport) {
        self.next.settle(ask, permit, report).await;
        let hold = self.hold.lock().unwrap_or_else(|e| e.into_inner()).take();
        let prices = &self.inner.cfg.prices;
        let spend = match &report.usage {
            Some(usage) => {
                self.own.fetch_add(usage.total(), Ordering::Relaxed);
                let usd = prices.cost_usd(ask.model, usage).unwrap_or(0.0);
                self.inner.metrics.tenant_spent(&self.tenant, usage, usd);
                Spend {
                    tokens: usage.total(),
                    cost_nanos: prices.cost_nanos(ask.model, usage),
                }
            }
            None => Spend::default(),
        };
        // Only a tenant with a budget holds, and pays a statement per call for its count:
        // the hold becomes what the call spent (nothing, for a call that never answered).
        if let Some(hold) = hold {
            self.settle_hold(hold, spend).await;
        }
    }
}

/// When a session of `tenant` parked for its budget wakes by itself: when the first of its
/// budgets' periods turns over (a budget still spent then parks it again).
pub(crate) async fn park_until(inner: &Inner, tenant: &str) -> Option<chrono::DateTime<Utc>> {
    let now = Utc::now();
    tenant_budgets(inner, tenant)
        .await?
        .iter()
        .map(|b| b.period.next_start(now))
        .min()
}
