//! Budgets: the token budget a session tree shares, the cap on a tree's sessions, tenant
//! budgets per day or month, and what tokens cost.
//!
//! The tree's ledger lives on the session rows (migration 0009): a child's allowance is
//! drawn from its parent's remaining budget in the spawn's transaction and given back,
//! with what its subtree spent, when it ends (`BudgetStore::return_budget`). A child
//! started again after it ended (a follow-up, a retry) draws from its tree again in the
//! transaction that re-opens it, its earlier spend held again rather than counted twice
//! (migration 0014), so a tree ends within its budget plus one call whatever happens to
//! its sessions. A session's
//! own spend is the token count its checkpoints store anyway, so budgets cost a checkpoint
//! nothing. Tenant spend is counted per UTC day in `tenant_spend`; a month is the sum of
//! its days.
//!
//! Cost is computed at read time from stored usage and the configured prices (per
//! session, per tree) rather than stored per row: prices change, and a stored cost would
//! either be wrong after a change or need a column per checkpoint. Tenant spend in money
//! is the exception: it is counted when the call settles, at the price of that moment,
//! because a budget in dollars must not move when a price is edited afterwards.

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use globset::{Glob, GlobMatcher};
use serde::{Deserialize, Serialize};

use agentq_agent::schema::Usage;

use crate::error::{Error, Result};
use crate::model::SessionRow;

/// The default of `policy.max_tree_sessions`: sessions one tree may create, root included.
pub const DEFAULT_MAX_TREE_SESSIONS: u64 = 1_000;

/// Nano-dollars in one dollar: money is counted in integers of 1e-9 USD, so that a price
/// of $0.075 per million tokens (75 nano-dollars per thousand tokens) adds up over many
/// small calls without rounding each to nothing.
pub const NANOS_PER_USD: f64 = 1e9;

/// Dollars as nano-dollars (negative and non-finite amounts as 0, huge ones saturated).
pub fn usd_to_nanos(usd: f64) -> u64 {
    let n = (usd * NANOS_PER_USD).round();
    if n.is_finite() && n > 0.0 {
        // `as` saturates at u64::MAX for a float beyond it.
        n as u64
    } else {
        0
    }
}

/// What a spawn must respect besides creating the child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnLimits {
    /// Sessions the tree may hold, root included.
    pub max_tree_sessions: u64,
    /// Draw the child's allowance from the parent's budget (when the parent has one).
    pub budget: Option<SpawnBudget>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnBudget {
    /// The parent's allowance when its row stores none (a root: its spec's token_budget).
    pub parent_allowance: u64,
    /// Tokens the caller asked for; at most the parent's remaining budget. `None`: half of
    /// it, so that a parent keeps some for itself and its other children.
    pub requested: Option<u64>,
    /// The parent's own spend as its running worker knows it: ahead of the stored one
    /// between checkpoints (its guardian's reviews of the round that spawns are recorded
    /// only with the round's next checkpoint), and a grant drawn past them would let the
    /// tree spend them twice. The larger of this and the stored spend is what counts.
    pub parent_spent: u64,
}

/// What `BudgetStore::spawn_session` did.
#[derive(Debug, Clone, PartialEq)]
pub enum Spawned {
    /// The child is new; its spec's `token_budget` is the allowance it drew.
    Created(SessionRow),
    /// A session with the same idempotency key exists (a re-run of the same call).
    Existing(SessionRow),
    /// The tree holds `max` sessions already: nothing was created.
    TreeFull { max: u64 },
    /// The parent has no budget left to give: nothing was created.
    NoBudget { remaining: u64 },
}

/// A session's part of its tree's ledger.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// The stored allowance (a child's); `None` for a root, whose allowance is its spec's.
    pub allowance: Option<u64>,
    /// Its own stored spend (input + output tokens).
    pub spent: u64,
    /// Allowances its live children hold.
    pub held: u64,
    /// What its finished children's subtrees spent.
    pub children_spent: u64,
}

impl Ledger {
    /// What is left of `allowance` given own spend `own` (the larger of the stored spend
    /// and what the caller knows to be newer).
    pub fn remaining(&self, allowance: u64, own: u64) -> u64 {
        allowance
            .saturating_sub(own.max(self.spent))
            .saturating_sub(self.held)
            .saturating_sub(self.children_spent)
    }
}

/// The allowance a child gets out of `remaining`, or `None` when there is nothing to give.
pub fn grant(remaining: u64, requested: Option<u64>) -> Option<u64> {
    if remaining == 0 {
        return None;
    }
    let g = match requested {
        Some(r) => r.min(remaining),
        None => remaining.div_ceil(2),
    };
    (g > 0).then_some(g)
}

/// How often a tenant budget resets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    Day,
    Month,
}

impl Period {
    pub fn as_str(self) -> &'static str {
        match self {
            Period::Day => "day",
            Period::Month => "month",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "day" => Some(Period::Day),
            "month" => Some(Period::Month),
            _ => None,
        }
    }

    /// When the period after the one holding `now` starts (UTC midnight).
    pub fn next_start(self, now: DateTime<Utc>) -> DateTime<Utc> {
        let today = now.date_naive();
        let next = match self {
            Period::Day => today.succ_opt(),
            Period::Month => today
                .with_day(1)
                .and_then(|d| d.checked_add_months(chrono::Months::new(1))),
        };
        next.and_then(|d| d.and_hms_opt(0, 0, 0))
            .map_or(now + chrono::Duration::days(1), |t| t.and_utc())
    }

    /// The first and last UTC day (`YYYY-MM-DD`) of the period holding `now`.
    pub fn days(self, now: DateTime<Utc>) -> (String, String) {
        let today = now.date_naive();
        match self {
            Period::Day => (day_key(today), day_key(today)),
            Period::Month => {
                let first = today.with_day(1).unwrap_or(today);
                (day_key(first), day_key(today))
            }
        }
    }
}

/// The stored key of a UTC day.
pub fn day_key(d: NaiveDate) -> String {
    d.format("%Y-%m-%d").to_string()
}

/// What happens to a tenant's sessions once its budget is spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OnBudget {
    /// Suspended (`waiting`, reason `budget`) until the budget is raised or the period turns.
    Park,
    /// Ended with `budget_exhausted`.
    #[default]
    Fail,
}

impl OnBudget {
    pub fn as_str(self) -> &'static str {
        match self {
            OnBudget::Park => "park",
            OnBudget::Fail => "fail",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "park" => Some(OnBudget::Park),
            "fail" => Some(OnBudget::Fail),
            _ => None,
        }
    }
}

/// A tenant's budget for one period (configured, or set through the admin API).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantBudget {
    pub tenant: String,
    pub period: Period,
    /// Tokens (input + output) per period.
    pub tokens: Option<u64>,
    /// Money per period, in nano-dollars.
    pub usd_nanos: Option<u64>,
    pub on_budget: OnBudget,
}

/// What a tenant spent in a period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spend {
    pub tokens: u64,
    pub cost_nanos: u64,
}

impl Spend {
    /// Both spends together (saturating: a sum of stored counts never wraps).
    pub fn plus(self, other: Spend) -> Spend {
        Spend {
            tokens: self.tokens.saturating_add(other.tokens),
            cost_nanos: self.cost_nanos.saturating_add(other.cost_nanos),
        }
    }
}

/// One LLM call's hold on its tenant's budgets: its worst case (the prompt's estimate and
/// all of `max_tokens`, at its price) from its start to its end
/// (`BudgetStore::hold_tenant_spend`, `BudgetStore::settle_tenant_hold`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantHold {
    /// Unique per call.
    pub id: String,
    pub tenant: String,
    pub worst: Spend,
    /// How long the hold outlives a worker that died during the call.
    pub ttl: std::time::Duration,
}

/// Why a call could not hold its tenant's budget: `budget` is the index (in the budgets
/// asked about) of the first one reached, `message` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldRefused {
    pub budget: usize,
    pub message: String,
    /// `None`: the recorded spend alone reached the budget, so the call must not start.
    /// `Some(t)`: only with the holds of the other calls in flight, which may spend less
    /// than they hold: the call waits for them to settle; `t` is when the first of them
    /// expires (its worker died, if it has not settled by then).
    pub holds_expire: Option<DateTime<Utc>>,
}

/// A tenant's running totals (`tenant_ledger`): its spend on the latest UTC day and in
/// the latest UTC month it spent in, and what its calls in flight hold. One row per
/// tenant, so that letting a call start reads and updates one row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantTotals {
    /// `YYYY-MM-DD`.
    pub day: String,
    pub day_spend: Spend,
    /// `YYYY-MM`.
    pub month: String,
    pub month_spend: Spend,
    pub held: Spend,
}

impl TenantTotals {
    /// The spend in each budget's current period as of `now`, in order: a counter of an
    /// earlier day or month counts as nothing spent.
    pub fn spent_per_budget(&self, budgets: &[TenantBudget], now: DateTime<Utc>) -> Vec<Spend> {
        let today = day_key(now.date_naive());
        budgets
            .iter()
            .map(|b| match b.period {
                Period::Day if self.day == today => self.day_spend,
                Period::Month
                    if today.starts_with(self.month.as_str()) && !self.month.is_empty() =>
                {
                    self.month_spend
                }
                _ => Spend::default(),
            })
            .collect()
    }
}

/// The tightest bound of each period and unit over a tenant's budgets: what a hold's
/// conditional update compares the ledger row with (`None`: no bound). A bound past
/// `i64::MAX` bounds nothing a database counter can reach, so it is `None` too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeriodBounds {
    pub day_tokens: Option<i64>,
    pub day_cost_nanos: Option<i64>,
    pub month_tokens: Option<i64>,
    pub month_cost_nanos: Option<i64>,
}

impl PeriodBounds {
    pub fn of(budgets: &[TenantBudget]) -> Self {
        fn tighter(a: Option<i64>, b: Option<u64>) -> Option<i64> {
            let b = b.and_then(|b| i64::try_from(b).ok());
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        }
        budgets.iter().fold(Self::default(), |mut acc, b| {
            match b.period {
                Period::Day => {
                    acc.day_tokens = tighter(acc.day_tokens, b.tokens);
                    acc.day_cost_nanos = tighter(acc.day_cost_nanos, b.usd_nanos);
                }
                Period::Month => {
                    acc.month_tokens = tighter(acc.month_tokens, b.tokens);
                    acc.month_cost_nanos = tighter(acc.month_cost_nanos, b.usd_nanos);
                }
            }
            acc
        })
    }
}

/// The stored key of a UTC month (`YYYY-MM`).
pub fn month_key(now: DateTime<Utc>) -> String {
    now.format("%Y-%m").to_string()
}

/// The first of `budgets` that its recorded spend (`spent`, one per budget, in its period)
/// has reached, else the first that it reaches with what the calls in flight hold
/// (`held`, the first of whose holds expires at `held_expires`), for
/// `BudgetStore::hold_tenant_spend`.
pub fn first_reached(
    budgets: &[TenantBudget],
    spent: &[Spend],
    held: Spend,
    held_expires: Option<DateTime<Utc>>,
) -> Option<HoldRefused> {
    let reached = |extra: Spend| {
        budgets
            .iter()
            .zip(spent)
            .enumerate()
            .find_map(|(i, (b, s))| b.reached(s.plus(extra)).map(|m| (i, m)))
    };
    if let Some((budget, message)) = reached(Spend::default()) {
        return Some(HoldRefused {
            budget,
            message,
            holds_expire: None,
        });
    }
    let (budget, message) = reached(held)?;
    Some(HoldRefused {
        budget,
        message: format!("{message}, counting what the calls in flight hold"),
        // Holds that reach a budget exist, so their first expiry does too; without it the
        // caller looks again after its shortest wait.
        holds_expire: Some(held_expires.unwrap_or_else(Utc::now)),
    })
}

impl TenantBudget {
    /// Whether `spend` has reached this budget; the message names the bound.
    pub fn reached(&self, spend: Spend) -> Option<String> {
        if let Some(t) = self.tokens
            && spend.tokens >= t
        {
            return Some(format!(
                "tenant {}'s budget of {t} tokens per {} is spent ({} used)",
                self.tenant,
                self.period.as_str(),
                spend.tokens
            ));
        }
        if let Some(n) = self.usd_nanos
            && spend.cost_nanos >= n
        {
            return Some(format!(
                "tenant {}'s budget of ${:.4} per {} is spent (${:.4} used)",
                self.tenant,
                n as f64 / NANOS_PER_USD,
                self.period.as_str(),
                spend.cost_nanos as f64 / NANOS_PER_USD
            ));
        }
        None
    }
}

/// Usage of one model within a tree.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelUsage {
    /// The model the sessions named (`None`: the worker's default).
    pub model: Option<String>,
    pub sessions: u64,
    pub usage: Usage,
}

/// What a web search the provider runs costs when a price entry does not say: Anthropic's
/// list price, $10 per 1,000 searches (the only provider whose searches agentq offers).
pub const DEFAULT_WEB_SEARCH_USD_PER_1K: f64 = 10.0;

/// One `[[prices]]` entry: dollars per million tokens of a model (glob), and per 1,000
/// web searches its provider runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct PriceEntry {
    pub model: String,
    #[serde(default)]
    pub input: f64,
    #[serde(default)]
    pub output: f64,
    #[serde(default)]
    pub cache_read: f64,
    #[serde(default)]
    pub cache_write: f64,
    /// Dollars per 1,000 web searches; unset: [`DEFAULT_WEB_SEARCH_USD_PER_1K`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_search: Option<f64>,
}

/// The configured prices, matched in order (first match wins).
#[derive(Debug, Clone, Default)]
pub struct Prices {
    entries: Vec<(GlobMatcher, PriceEntry)>,
}

impl Prices {
    pub fn new(entries: &[PriceEntry]) -> Result<Self> {
        let mut out = Vec::with_capacity(entries.len());
        for e in entries {
            let g = Glob::new(&e.model)
                .map_err(|err| Error::Config(format!("prices.model `{}`: {err}", e.model)))?;
            out.push((g.compile_matcher(), e.clone()));
        }
        Ok(Prices { entries: out })
    }

    /// The price of `model`, if one is configured.
    pub fn of(&self, model: &str) -> Option<&PriceEntry> {
        self.entries
            .iter()
            .find(|(g, _)| g.is_match(model))
            .map(|(_, e)| e)
    }

    /// What `usage` of `model` cost, in dollars; `None` when the model has no price.
    /// Input tokens are billed at the input price except those read from or written to
    /// the cache, which are billed at the cache prices (providers report them within the
    /// input count); web searches at the search price.
    pub fn cost_usd(&self, model: &str, usage: &Usage) -> Option<f64> {
        let p = self.of(model)?;
        let cached = usage
            .cache_read_tokens
            .saturating_add(usage.cache_write_tokens);
        let plain = usage.input_tokens.saturating_sub(cached);
        let m = 1e6;
        let per_search = p.web_search.unwrap_or(DEFAULT_WEB_SEARCH_USD_PER_1K) / 1e3;
        Some(
            plain as f64 * p.input / m
                + usage.output_tokens as f64 * p.output / m
                + usage.cache_read_tokens as f64 * p.cache_read / m
                + usage.cache_write_tokens as f64 * p.cache_write / m
                + usage.web_search_requests as f64 * per_search,
        )
    }

    /// [`Prices::cost_usd`] in nano-dollars (0 without a price).
    pub fn cost_nanos(&self, model: &str, usage: &Usage) -> u64 {
        usd_to_nanos(self.cost_usd(model, usage).unwrap_or(0.0))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn grants_take_half_or_what_was_asked_within_the_remaining() {
        assert_eq!(grant(0, None), None);
        assert_eq!(grant(0, Some(10)), None);
        assert_eq!(grant(1, None), Some(1));
        assert_eq!(grant(1000, None), Some(500));
        assert_eq!(grant(1000, Some(10_000)), Some(1000));
        assert_eq!(grant(1000, Some(0)), None);
    }

    #[test]
    fn remaining_counts_own_spend_held_and_finished_children() {
        let l = Ledger {
            allowance: None,
            spent: 100,
            held: 300,
            children_spent: 50,
        };
        assert_eq!(l.remaining(1000, 0), 550);
        assert_eq!(l.remaining(1000, 200), 450);
        assert_eq!(l.remaining(100, 0), 0);
    }

    #[test]
    fn a_budget_reached_by_spend_refuses_and_one_reached_by_holds_waits() {
        let b = TenantBudget {
            tenant: "acme".into(),
            period: Period::Day,
            tokens: Some(1000),
            usd_nanos: None,
            on_budget: OnBudget::Fail,
        };
        let spend = |tokens| Spend {
            tokens,
            cost_nanos: 0,
        };
        let at = Utc::now();
        let budgets = std::slice::from_ref(&b);
        assert_eq!(
            first_reached(budgets, &[spend(900)], spend(99), Some(at)),
            None
        );
        let wait = first_reached(budgets, &[spend(900)], spend(100), Some(at)).unwrap();
        assert_eq!(wait.holds_expire, Some(at));
        assert!(wait.message.contains("in flight"), "{}", wait.message);
        let spent = first_reached(budgets, &[spend(1000)], spend(500), Some(at)).unwrap();
        assert_eq!(spent.holds_expire, None);
        assert!(spent.message.contains("(1000 used)"), "{}", spent.message);
    }

    #[test]
    fn cost_of_a_known_usage_first_price_wins() {
        let prices = Prices::new(&[
            PriceEntry {
                model: "gpt-4o-mini*".into(),
                input: 0.15,
                output: 0.60,
                cache_read: 0.075,
                cache_write: 0.0,
                web_search: None,
            },
            PriceEntry {
                model: "gpt-4o*".into(),
                input: 2.5,
                output: 10.0,
                ..Default::default()
            },
        ])
        .unwrap();
        let usage = Usage {
            input_tokens: 1_000_000,
            output_tokens: 500_000,
            cache_read_tokens: 200_000,
            ..Default::default()
        };
        // 800k plain input at 0.15, 200k cached at 0.075, 500k output at 0.60.
        let c = prices.cost_usd("gpt-4o-mini-2024", &usage).unwrap();
        assert!((c - (0.12 + 0.015 + 0.30)).abs() < 1e-9, "{c}");
        assert_eq!(prices.cost_nanos("gpt-4o-mini", &usage), 435_000_000);
        let c = prices.cost_usd("gpt-4o", &usage).unwrap();
        assert!((c - (2.0 + 5.0)).abs() < 1e-9, "{c}");
        assert_eq!(prices.cost_usd("claude", &usage), None);
        assert_eq!(prices.cost_nanos("claude", &usage), 0);
    }

    #[test]
    fn searches_cost_the_list_price_unless_the_entry_says() {
        let prices = Prices::new(&[
            PriceEntry {
                model: "claude-cheap*".into(),
                input: 3.0,
                web_search: Some(5.0),
                ..Default::default()
            },
            PriceEntry {
                model: "claude-*".into(),
                input: 3.0,
                ..Default::default()
            },
        ])
        .unwrap();
        let usage = Usage {
            input_tokens: 1_000_000,
            web_search_requests: 3,
            ..Default::default()
        };
        // $3 of input and 3 searches at $10 per 1,000.
        assert_eq!(prices.cost_nanos("claude-x", &usage), 3_030_000_000);
        assert_eq!(prices.cost_nanos("claude-cheap-1", &usage), 3_015_000_000);
        let searches_only = Usage {
            web_search_requests: 1,
            ..Default::default()
        };
        assert_eq!(prices.cost_nanos("claude-x", &searches_only), 10_000_000);
        // An unpriced model's searches are as unknown as its tokens.
        assert_eq!(prices.cost_usd("gpt-4o", &searches_only), None);
    }

    #[test]
    fn periods_and_reached_budgets() {
        let now = DateTime::parse_from_rfc3339("2026-03-17T10:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        assert_eq!(
            Period::Day.days(now),
            ("2026-03-17".into(), "2026-03-17".into())
        );
        assert_eq!(
            Period::Month.days(now),
            ("2026-03-01".into(), "2026-03-17".into())
        );
        assert_eq!(
            Period::Day.next_start(now).to_rfc3339(),
            "2026-03-18T00:00:00+00:00"
        );
        assert_eq!(
            Period::Month.next_start(now).to_rfc3339(),
            "2026-04-01T00:00:00+00:00"
        );
        let b = TenantBudget {
            tenant: "acme".into(),
            period: Period::Day,
            tokens: Some(100),
            usd_nanos: Some(1_000),
            on_budget: OnBudget::Park,
        };
        assert_eq!(
            b.reached(Spend {
                tokens: 99,
                cost_nanos: 999
            }),
            None
        );
        assert!(
            b.reached(Spend {
                tokens: 100,
                cost_nanos: 0
            })
            .unwrap()
            .contains("100 tokens per day")
        );
        assert!(
            b.reached(Spend {
                tokens: 0,
                cost_nanos: 1_000
            })
            .unwrap()
            .contains("$")
        );
    }

    #[test]
    fn period_bounds_take_the_tightest_of_each_period_and_unit() {
        let b = |period, tokens, usd_nanos| TenantBudget {
            tenant: "t".into(),
            period,
            tokens,
            usd_nanos,
            on_budget: OnBudget::Fail,
        };
        let bounds = PeriodBounds::of(&[
            b(Period::Day, Some(500), None),
            b(Period::Day, Some(300), Some(u64::MAX)),
            b(Period::Month, None, Some(7)),
        ]);
        assert_eq!(
            bounds,
            PeriodBounds {
                day_tokens: Some(300),
                day_cost_nanos: None,
                month_tokens: None,
                month_cost_nanos: Some(7),
            }
        );
        assert_eq!(PeriodBounds::of(&[]), PeriodBounds::default());
    }

    #[test]
    fn totals_of_an_earlier_period_count_nothing() {
        use chrono::TimeZone;
        let now = Utc.with_ymd_and_hms(2031, 6, 1, 0, 0, 1).unwrap();
        let t = TenantTotals {
            day: "2031-05-31".into(),
            day_spend: Spend {
                tokens: 5,
                cost_nanos: 1,
            },
            month: "2031-05".into(),
            month_spend: Spend {
                tokens: 9,
                cost_nanos: 2,
            },
            held: Spend::default(),
        };
        let day = |period| TenantBudget {
            tenant: "t".into(),
            period,
            tokens: Some(1),
            usd_nanos: None,
            on_budget: OnBudget::Fail,
        };
        assert_eq!(
            t.spent_per_budget(&[day(Period::Day), day(Period::Month)], now),
            vec![Spend::default(), Spend::default()]
        );
        let before = Utc.with_ymd_and_hms(2031, 5, 31, 23, 0, 0).unwrap();
        assert_eq!(
            t.spent_per_budget(&[day(Period::Day), day(Period::Month)], before),
            vec![t.day_spend, t.month_spend]
        );
    }
}
