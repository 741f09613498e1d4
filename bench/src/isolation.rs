//! The isolation part: bystander sessions' iterations/s alone and beside hostile sessions
//! (`--hostile-percent` of all sessions, of the `--hostile` kinds) on the same in-process
//! workers, Postgres and Redis, and what became of the hostile sessions. Every session's
//! model is the fake OpenAI endpoint, so hostile output goes through the real provider.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use tokio_util::sync::CancellationToken;

use agentq_core::redis_queue::RedisQueue;
use agentq_core::{NewSession, SessionStore, WorkQueue};
use agentq_fixtures::FakeLlm;

use crate::env::Env;
use crate::hostile::{self, Kind};
use crate::llm;
use crate::report::{Outcomes, Results, progress};
use crate::workload::{close, config, create_sessions, enqueue, start};

/// How long hostile sessions get to end once the bystanders beside them have; those still
/// going then are reported as unfinished (a zombie would never end).
const HOSTILE_GRACE: Duration = Duration::from_secs(60);
/// Beyond a worker's drain timeout, how long its stop may take before it is abandoned.
const STOP_SLACK: Duration = Duration::from_secs(10);
/// Longest error text kept in an outcome's label (the outcomes group sessions by label).
const REASON_CHARS: usize = 120;

pub async fn isolation(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let a = &env.args;
    let kinds = hostile::selected(&a.hostile)?;
    let (bystanders, iterations) = (a.sessions, a.iterations);
    let hostiles = hostile::count(bystanders, a.hostile_percent);
    let bytes = usize::try_from(a.hostile_bytes)?;
    let tool = env.tool().to_string();
    let fake = {
        let tool = tool.clone();
        FakeLlm::start_stateless(Duration::ZERO, move |body| {
            hostile::answer(body, iterations, &tool, bytes)
        })
        .await?
    };
    let queue = env.queue("isolation");
    let shutdown = CancellationToken::new();
    let mut handles = Vec::new();
    let mut stores = Vec::new();
    let mut drain = Duration::ZERO;
    for i in 0..a.workers {
        let mut cfg = config(
            env,
            &queue,
            &format!("isolation-{i}"),
            a.concurrency,
            "",
            &tool,
        )?;
        cfg.default_provider = Some("openai".into());
        cfg.providers.openai_base_url = Some(llm::base_url(&fake));
        cfg.providers.openai_api_key = Some("bench".into());
        cfg.policy = Arc::new(agentq_core::policy::Policy::from_section(
            &agentq_core::config::PolicySection {
                tools: hostile::tools(&tool),
                ..Default::default()
            },
        )?);
        drain = drain.max(cfg.drain_timeout);
        let (wk, store) = start(env, cfg).await?;
        let s = shutdown.clone();
        handles.push(tokio::spawn(async move { wk.run(s).await }));
        stores.push(store);
    }
    let redis = RedisQueue::connect(&env.redis_url).await?;
    redis.ensure_queue(&queue).await?;
    let measured = rounds(env, &redis, &queue, &kinds, hostiles).await;
    shutdown.cancel();
    for h in handles {
        let abort = h.abort_handle();
        if tokio::time::timeout(drain.saturating_add(STOP_SLACK), h)
            .await
            .is_err()
        {
            progress("isolation: a worker did not stop within its drain timeout; abandoned");
            abort.abort();
        }
    }
    for store in &stores {
        close(store).await;
    }
    let m = measured?;
    let per_round = f64::from(bystanders) * f64::from(iterations);
    let alone = 2.0 * per_round / (m.alone.0 + m.alone.1).as_secs_f64();
    let control = 2.0 * per_round / (m.control.0 + m.control.1).as_secs_f64();
    let mixed = per_round / m.mixed.as_secs_f64();
    r.isolation_bystanders = Some(bystanders);
    r.isolation_hostiles = Some(hostiles);
    r.isolation_hostile_kinds = kinds.iter().map(|k| k.name().to_string()).collect();
    r.isolation_alone_iterations_per_s = Some(alone);
    r.isolation_control_iterations_per_s = Some(control);
    r.isolation_mixed_iterations_per_s = Some(mixed);
    r.isolation_ratio = Some(mixed / control);
    r.isolation_ratio_vs_alone = Some(mixed / alone);
    r.isolation_bystanders_failed = Some(m.bystanders_failed);
    progress(&format!(
        "isolation: bystanders {alone:.0} iterations/s alone, {control:.0} beside {hostiles} \
         benign sessions, {mixed:.0} beside {hostiles} hostile ones (ratio {:.2}, {:.2} of \
         alone); {} bystanders failed; hostile sessions: {} completed, {} failed, {} \
         unfinished; {} LLM requests served",
        mixed / control,
        mixed / alone,
        m.bystanders_failed,
        m.outcomes.completed,
        m.outcomes.failed,
        m.outcomes.unfinished,
        fake.request_count()
    ));
    r.isolation_outcomes = Some(m.outcomes);
    Ok(())
}

struct Measured {
    /// The bystander rounds alone, before and after the mixed one.
    alone: (Duration, Duration),
    /// The bystander rounds beside as many benign sessions as the mixed round has
    /// hostile ones, before and after it.
    control: (Duration, Duration),
    mixed: Duration,
    bystanders_failed: u64,
    outcomes: Outcomes,
}

/// A warm-up round, a round alone, a control round, the mixed round, a second control
/// round and a second round alone (so that a drift of the machine's speed during the run
/// weighs on both sides of each ratio). A control round puts as many benign sessions (a
/// bystander's spec) beside the bystanders, in the same order, as the mixed round puts
/// hostile ones: what the mixed round loses against it is what hostility costs, beyond
/// the load of 10% more sessions on the same slots.
async fn rounds(
    env: &Env,
    redis: &RedisQueue,
    queue: &str,
    kinds: &[Kind],
    hostiles: u32,
) -> anyhow::Result<Measured> {
    let a = &env.args;
    let deadline = Duration::from_secs(a.isolation_deadline_secs);
    // A round of bystanders only: its time and its failed bystanders. Before the mixed
    // round a failure is the run's error; after it, hostile sessions may still be going.
    let alone = async |label: &str, strict: bool, benign: u32| -> anyhow::Result<(Duration, u64)> {
        let ids = create_sessions(env, queue, a.sessions, a.iterations, env.tool()).await?;
        let extra = if benign > 0 {
            create_sessions(env, queue, benign, a.iterations, env.tool()).await?
        } else {
            Vec::new()
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        enqueue(redis, queue, &interleave(&ids, &extra)).await?;
        let elapsed = match wait_ended(env, &ids, started, deadline).await {
            Ok(d) => d,
            Err(e) if !strict => {
                progress(&format!("isolation: {label} round: {e:#}"));
                started.elapsed()
            }
            Err(e) => return Err(e.context(format!("isolation: {label} round"))),
        };
        let failed = bystanders_failed(env, &ids, a.iterations).await?;
        // The benign sessions end before the next round, so none of it runs beside them.
        if !extra.is_empty() {
            let _ = wait_ended(env, &extra, Instant::now(), deadline).await;
        }
        if strict && failed > 0 {
            bail!(
                "isolation: {failed} of {} bystanders failed in the {label} round, before any \
                 hostile session ran",
                ids.len()
            );
        }
        Ok((elapsed, failed))
    };
    alone("warm-up", true, 0).await?;
    let (first, _) = alone("first alone", true, 0).await?;
    let (control_first, _) = alone("first control", true, hostiles).await?;

    let ids = create_sessions(env, queue, a.sessions, a.iterations, env.tool()).await?;
    let (hostile_ids, mut outcomes) = create_hostiles(env, queue, kinds, hostiles).await?;
    let mut hostile_list: Vec<String> = hostile_ids.keys().cloned().collect();
    hostile_list.sort();
    let order = interleave(&ids, &hostile_list);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    enqueue(redis, queue, &order).await?;
    let mixed = match wait_ended(env, &ids, started, deadline).await {
        Ok(d) => d,
        Err(e) => {
            progress(&format!("isolation: mixed round: {e:#}"));
            started.elapsed()
        }
    };
    let failed = bystanders_failed(env, &ids, a.iterations).await?;
    let grace = Instant::now();
    let _ = wait_ended(env, &hostile_list, grace, HOSTILE_GRACE).await;
    tally(env, &hostile_ids, &mut outcomes).await?;

    let (control_second, failed_control) = alone("second control", false, hostiles).await?;
    let (second, failed_after) = alone("second alone", false, 0).await?;
    Ok(Measured {
        alone: (first, second),
        control: (control_first, control_second),
        mixed,
        bystanders_failed: failed
            .saturating_add(failed_control)
            .saturating_add(failed_after),
        outcomes,
    })
}

/// The mixed round's hostile sessions, shared among `kinds` (the first ones one more when
/// they do not divide evenly), with the kind of each; those the store refused are counted
/// in the outcomes, as failed.
async fn create_hostiles(
    env: &Env,
    queue: &str,
    kinds: &[Kind],
    hostiles: u32,
) -> anyhow::Result<(HashMap<String, Kind>, Outcomes)> {
    let a = &env.args;
    let mut outcomes = Outcomes::default();
    let mut hostile_ids: HashMap<String, Kind> = HashMap::new();
    for (i, kind) in kinds.iter().enumerate() {
        let n =
            hostiles / kinds.len() as u32 + u32::from((i as u32) < hostiles % kinds.len() as u32);
        if n == 0 {
            continue;
        }
        let new: Vec<NewSession> = (0..n)
            .map(|_| NewSession::root(kind.spec(a.iterations, env.tool()), queue))
            .collect();
        match env.store.create_sessions(&new).await {
            Ok(rows) => hostile_ids.extend(rows.into_iter().map(|(row, _)| (row.id, *kind))),
            Err(e) => {
                let label = format!("not created: {}", reason(&e.to_string()));
                *outcomes
                    .by_kind
                    .entry(kind.name().to_string())
                    .or_default()
                    .entry(label)
                    .or_default() += u64::from(n);
                outcomes.failed += u64::from(n);
            }
        }
    }
    Ok((hostile_ids, outcomes))
}

/// `bystanders` in order with `hostiles` spread evenly among them, so that both kinds are
/// on the workers together from the first read to the last.
fn interleave(bystanders: &[String], hostiles: &[String]) -> Vec<String> {
    let total = bystanders.len() + hostiles.len();
    let mut out = Vec::with_capacity(total);
    let (mut b, mut h) = (bystanders.iter(), hostiles.iter());
    for i in 0..total {
        // A hostile goes at each position where the running share of them rises.
        let due = (i + 1) * hostiles.len() / total > i * hostiles.len() / total;
        let next = if due {
            h.next().or_else(|| b.next())
        } else {
            b.next().or_else(|| h.next())
        };
        out.extend(next.cloned());
    }
    out
}

/// Wait until every one of `ids` has ended (completed, failed or cancelled): the time
/// since `started`, or an error once `limit` has passed.
async fn wait_ended(
    env: &Env,
    ids: &[String],
    started: Instant,
    limit: Duration,
) -> anyhow::Result<Duration> {
    let total = i64::try_from(ids.len())?;
    loop {
        let (ended,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM sessions WHERE id = ANY($1) \
             AND status IN ('completed', 'failed', 'cancelled')",
        )
        .bind(ids)
        .fetch_one(env.store.pool())
        .await?;
        if ended >= total {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            bail!(
                "only {ended} of {total} sessions ended in {} s (--isolation-deadline-secs)",
                limit.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Bystanders that did not complete with every iteration.
async fn bystanders_failed(env: &Env, ids: &[String], iterations: u32) -> anyhow::Result<u64> {
    let (ok,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM sessions WHERE id = ANY($1) AND status = 'completed' AND iteration = $2",
    )
    .bind(ids)
    .bind(i32::try_from(iterations)?)
    .fetch_one(env.store.pool())
    .await?;
    Ok((ids.len() as u64).saturating_sub(u64::try_from(ok)?))
}

/// Each hostile session's outcome, counted per kind.
async fn tally(env: &Env, kinds: &HashMap<String, Kind>, out: &mut Outcomes) -> anyhow::Result<()> {
    let ids: Vec<String> = kinds.keys().cloned().collect();
    let rows: Vec<(String, String, Option<String>, Option<String>)> =
        sqlx::query_as("SELECT id, status, finish_reason, error FROM sessions WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(env.store.pool())
            .await?;
    for (id, status, finish, error) in rows {
        let Some(kind) = kinds.get(&id) else {
            continue;
        };
        let label = match status.as_str() {
            "completed" => {
                out.completed += 1;
                status
            }
            "failed" | "cancelled" => {
                out.failed += 1;
                let mut l = status;
                for part in [finish, error].into_iter().flatten() {
                    l.push_str(": ");
                    l.push_str(&reason(&part));
                }
                l
            }
            _ => {
                out.unfinished += 1;
                format!("{status} (not ended {} s later)", HOSTILE_GRACE.as_secs())
            }
        };
        *out.by_kind
            .entry(kind.name().to_string())
            .or_default()
            .entry(label)
            .or_default() += 1;
    }
    Ok(())
}

/// An error's first line, at most [`REASON_CHARS`] characters.
fn reason(text: &str) -> String {
    let line = text.lines().next().unwrap_or_default();
    let mut out: String = line.chars().take(REASON_CHARS).collect();
    if line.chars().count() > REASON_CHARS {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}{i}")).collect()
    }

    #[test]
    fn hostiles_are_spread_among_the_bystanders() {
        let order = interleave(&names("b", 9), &names("h", 3));
        assert_eq!(order.len(), 12);
        let at: Vec<usize> = order
            .iter()
            .enumerate()
            .filter(|(_, id)| id.starts_with('h'))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(at, [3, 7, 11]);
        assert_eq!(interleave(&names("b", 2), &[]), names("b", 2));
        assert_eq!(interleave(&[], &names("h", 2)), names("h", 2));
    }

    #[test]
    fn a_reason_is_its_first_line_shortened() {
        assert_eq!(reason("tool failed\nbacktrace"), "tool failed");
        let long = "x".repeat(500);
        assert_eq!(reason(&long).chars().count(), REASON_CHARS + 1);
    }
}
