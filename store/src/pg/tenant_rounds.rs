//! A tenant's budget holds and settlements from this process, taken together. Each of them
//! updates the tenant's one totals row, and Postgres keeps a row's lock until the commit is
//! on disk: one at a time, a tenant's calls are bounded by one durable commit each (a few
//! hundred a second) whatever the statements cost. So the calls of one tenant that arrive
//! while a round of its is in flight wait for it and go together in the next round, one
//! transaction and one commit for all of them, as the group commit does for checkpoints.
//! A call that finds nothing in flight goes alone, by the one statement it always took.
//! The rounds are [`super::rounds`]'s, keyed by tenant.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use sqlx::Postgres;
use sqlx::postgres::PgPool;
use tokio::sync::oneshot;

use crate::budget::{HoldRefused, Spend, TenantBudget, TenantHold, first_reached};
use crate::error::{Error, Result};
use crate::rowconv::to_i64;
use crate::sql::{ledger, totals};

use super::rounds::Rounds;
use super::tenant_holds::{hold, recount, settle_hold};

/// The settled holds gone, in one statement, with what they held.
const UNHOLD_MANY: &str = "
WITH gone AS (DELETE FROM tenant_holds WHERE id = ANY($1) RETURNING tokens, cost_nanos)
SELECT COALESCE(sum(tokens), 0)::bigint, COALESCE(sum(cost_nanos), 0)::bigint FROM gone";

const UNCOUNT: &str = "
UPDATE tenant_ledger SET held_tokens = GREATEST(held_tokens - $2, 0),
    held_cost_nanos = GREATEST(held_cost_nanos - $3, 0)
WHERE tenant = $1";

const STORED: &str = "SELECT id FROM tenant_holds WHERE id = ANY($1)";

/// The admitted holds of a round, from arrays.
const INSERT_HOLDS: &str = "
INSERT INTO tenant_holds (id, tenant, tokens, cost_nanos, expires_at)
SELECT i, $5, t, c, now() + make_interval(secs => s)
FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::float8[]) AS u(i, t, c, s)";

pub(crate) enum Op {
    Hold {
        hold: TenantHold,
        budgets: Vec<TenantBudget>,
        now: DateTime<Utc>,
        done: oneshot::Sender<Result<Option<HoldRefused>>>,
    },
    Settle {
        id: String,
        day: String,
        spend: Spend,
        done: oneshot::Sender<Result<()>>,
    },
}

/// The answer to the op `make` builds around its answer's sender, in `tenant`'s next
/// round.
pub(crate) async fn ask<T>(
    rounds: &Arc<Rounds<Op>>,
    pool: &PgPool,
    tenant: &str,
    make: impl FnOnce(oneshot::Sender<Result<T>>) -> Op,
) -> Result<T> {
    let (done, answer) = oneshot::channel();
    let (pool, key) = (pool.clone(), tenant.to_string());
    rounds.submit(tenant, make(done), move |ops| {
        let (pool, tenant) = (pool.clone(), key.clone());
        async move { round(&pool, &tenant, ops).await }
    });
    answer.await.map_err(|_| Error::Stopped)?
}

async fn round(pool: &PgPool, tenant: &str, mut ops: Vec<Op>) {
    if ops.len() == 1
        && let Some(op) = ops.pop()
    {
        match op {
            Op::Hold {
                hold: h,
                budgets,
                now,
                done,
            } => {
                let _ = done.send(again(|| hold(pool, &h, &budgets, now)).await);
            }
            Op::Settle {
                id,
                day,
                spend,
                done,
            } => {
                let answer = again(|| settle_hold(pool, &id, tenant, &day, spend)).await;
                let _ = done.send(answer);
            }
        }
        return;
    }
    let mut settles = Vec::new();
    let mut holds = Vec::new();
    for op in ops {
        match op {
            Op::Settle {
                id,
                day,
                spend,
                done,
            } => settles.push((id, day, spend, done)),
            Op::Hold {
                hold,
                budgets,
                now,
                done,
            } => holds.push((hold, budgets, now, done)),
        }
    }
    let asks: Vec<_> = holds
        .iter()
        .map(|(h, b, n, _)| (h, b.as_slice(), *n))
        .collect();
    let settled: Vec<_> = settles
        .iter()
        .map(|(i, d, s, _)| (i.as_str(), d.as_str(), *s))
        .collect();
    match again(|| together(pool, tenant, &settled, &asks)).await {
        Ok(answers) => {
            for ((.., done), answer) in holds.into_iter().zip(answers) {
                let _ = done.send(Ok(answer));
            }
            for (.., done) in settles {
                let _ = done.send(Ok(()));
            }
        }
        Err(e) => {
            let e = Arc::new(e);
            for (.., done) in holds {
                let _ = done.send(Err(Error::Shared(e.clone())));
            }
            for (.., done) in settles {
                let _ = done.send(Err(Error::Shared(e.clone())));
            }
        }
    }
}

/// How many times a transaction the database aborted for a deadlock or a serialization
/// failure is run again: it changed nothing, and a settlement given up is a spend lost
/// and a hold left counted until it expires.
const ATTEMPTS: u32 = 4;

/// `op`, run again while the database aborts it for a conflict with another process's.
pub(super) async fn again<T, F, Fut>(mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Err(e) if attempt < ATTEMPTS && aborted_for_conflict(&e) => attempt += 1,
            other => return other,
        }
    }
}

fn aborted_for_conflict(e: &Error) -> bool {
    matches!(e, Error::Db(sqlx::Error::Database(d))
        if matches!(d.code().as_deref(), Some("40P01" | "40001")))
}

/// One transaction for a round: the settlements first (they free room), then each hold
/// in arrival order, decided as a hold alone would be on the totals as the ones before it
/// left them.
async fn together(
    pool: &PgPool,
    tenant: &str,
    settles: &[(&str, &str, Spend)],
    holds: &[(&TenantHold, &[TenantBudget], DateTime<Utc>)],
) -> Result<Vec<Option<HoldRefused>>> {
    let mut tx = pool.begin().await?;
    // The tenant's totals row first, as every other statement on a tenant's budget takes
    // it (a hold's update, a single settlement's upsert, whose day's spend comes after):
    // taking the day's spend first deadlocked with a settlement of another process.
    let (day, month) = totals::period_keys(holds.first().map_or_else(Utc::now, |h| h.2));
    sqlx::query(totals::ENSURE)
        .bind(tenant)
        .bind(&day)
        .bind(&month)
        .execute(&mut *tx)
        .await?;
    sqlx::query(totals::LOCK)
        .bind(tenant)
        .execute(&mut *tx)
        .await?;
    if !settles.is_empty() {
        let ids: Vec<&str> = settles.iter().map(|s| s.0).collect();
        let (t, c): (i64, i64) = sqlx::query_as(UNHOLD_MANY)
            .bind(&ids)
            .fetch_one(&mut *tx)
            .await?;
        let mut per_day: BTreeMap<&str, Spend> = BTreeMap::new();
        for (_, day, spend) in settles {
            let d = per_day.entry(day).or_default();
            *d = d.plus(*spend);
        }
        for (day, spend) in per_day {
            ledger::add_spend(&mut *tx, tenant, day, spend).await?;
            totals::add_to_totals(&mut *tx, tenant, day, spend).await?;
        }
        sqlx::query(UNCOUNT)
            .bind(tenant)
            .bind(t)
            .bind(c)
            .execute(&mut *tx)
            .await?;
    }
    let answers = if holds.is_empty() {
        Vec::new()
    } else {
        hold_all(&mut tx, tenant, holds).await?
    };
    tx.commit().await?;
    Ok(answers)
}

async fn hold_all(
    tx: &mut sqlx::Transaction<'_, Postgres>,
    tenant: &str,
    holds: &[(&TenantHold, &[TenantBudget], DateTime<Utc>)],
) -> Result<Vec<Option<HoldRefused>>> {
    let row = totals::totals::<Postgres, _>(&mut **tx, totals::TOTALS_LOCKED, tenant).await?;
    let ids: Vec<&str> = holds.iter().map(|h| h.0.id.as_str()).collect();
    let stored: Vec<String> = sqlx::query_scalar(STORED)
        .bind(&ids)
        .fetch_all(&mut **tx)
        .await?;
    let mut seen: HashSet<&str> = stored.iter().map(String::as_str).collect();
    let mut held = row.held;
    let mut expires = None;
    let mut recounted = false;
    let mut admitted: Vec<&TenantHold> = Vec::new();
    let mut answers = Vec::with_capacity(holds.len());
    for (h, budgets, now) in holds {
        // A hold already stored (a retry, or twice in this round) counts once.
        if !seen.insert(h.id.as_str()) {
            answers.push(None);
            continue;
        }
        let spent = row.spent_per_budget(budgets, *now);
        let mut refused = first_reached(budgets, &spent, held, expires);
        if refused.is_some() && !recounted {
            // What the count says may include holds of dead workers: recount once, as a
            // hold alone does before it refuses.
            recounted = true;
            let (stored, first) = recount(tx, tenant).await?;
            let this_round = admitted
                .iter()
                .fold(Spend::default(), |acc, a| acc.plus(a.worst));
            held = stored.plus(this_round);
            expires = first;
            refused = first_reached(budgets, &spent, held, expires);
        }
        if refused.is_none() {
            held = held.plus(h.worst);
            admitted.push(h);
        }
        answers.push(refused);
    }
    if !admitted.is_empty() {
        let mut tokens = Vec::with_capacity(admitted.len());
        let mut costs = Vec::with_capacity(admitted.len());
        for h in &admitted {
            tokens.push(to_i64(h.worst.tokens, "tokens")?);
            costs.push(to_i64(h.worst.cost_nanos, "cost")?);
        }
        let ids: Vec<&str> = admitted.iter().map(|h| h.id.as_str()).collect();
        let ttls: Vec<f64> = admitted.iter().map(|h| h.ttl.as_secs_f64()).collect();
        sqlx::query(INSERT_HOLDS)
            .bind(&ids)
            .bind(&tokens)
            .bind(&costs)
            .bind(&ttls)
            .bind(tenant)
            .execute(&mut **tx)
            .await?;
    }
    totals::set_held::<Postgres, _>(&mut **tx, tenant, held).await?;
    Ok(answers)
}
