//! `admission`: what the fleet-wide rate limiter costs and how close it runs to a limit.
//! One `agentq worker` child per round, configured through `[[limits]]` in its
//! configuration file as a deployment would be, runs sessions against the fixtures'
//! rate-limited fake LLM (which enforces its own limit per key over a sliding minute, as a
//! provider does, and counts what it accepted and refused). Three rounds, each on a model
//! of its own so that no limiter state crosses between them:
//!
//! - `binding`: the model's configured `rpm` is the fake's own limit (both counted over
//!   10 s windows): iterations/s over the limit's rate (target ≥ 0.9) and the share of
//!   requests the fake refused (≤ 1 %);
//! - `nonbinding`: a configured limit far above what the worker can do;
//! - `none`: no limit configured: throughput with the non-binding limit over this
//!   (target within 5 %).
//!
//! The limiter's cost per call is read from the private Redis' `INFO commandstats`: the
//! script calls (`EVAL*`, `FCALL*`: round trips) per LLM call in the binding round, and
//! every command (those a script runs included) per iteration in the non-binding round
//! over the same in the unlimited one.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::Context;

use agentq_core::redis_queue::RedisQueue;
use agentq_core::{NewSession, SessionStore};
use agentq_fixtures::rate_limited::{Ask, Reply, Script};
use agentq_fixtures::{Limits, RateLimitedConfig, RateLimitedLlm};

use crate::env::Env;
use crate::procs::{check_alive, spawn_worker};
use crate::report::{Results, progress};
use crate::turns::{BUILTIN, FINAL_TEXT, TURN_TEXT, spec};
use crate::workload::enqueue;

/// The fake's latency per call: short, so that the non-binding rounds measure the
/// worker and the limiter rather than the model.
const LATENCY: Duration = Duration::from_millis(20);
/// Turns per session: more than any round runs, so no session ends within one.
const TURNS: u32 = 5_000;
/// The window the fake enforces its limit over and the limiter counts over
/// (`window_secs`): a minute's allowance spread evenly, as providers that enforce over
/// short windows do. The binding round measures after one whole window, so that the
/// allowance of the first one (which a limiter may spend at once) does not count.
const WINDOW: Duration = Duration::from_secs(10);
/// A limit no round reaches.
const NONBINDING_RPM: u64 = 100_000_000;
const ROUNDS: [&str; 3] = ["binding", "nonbinding", "none"];

fn model(round: &str) -> String {
    format!("bench-admission-{round}")
}

/// Every turn but the last lists the workspace, like the other parts' model.
fn script() -> Script {
    std::sync::Arc::new(|ask: &Ask<'_>| {
        Some(if ask.turn + 1 < TURNS as usize {
            Reply::text(TURN_TEXT).tool(BUILTIN, serde_json::json!({"path": "."}))
        } else {
            Reply::text(FINAL_TEXT)
        })
    })
}

/// The worker's configuration file: a limit for the binding and the non-binding models,
/// none for the third.
fn config(rpm: u64) -> String {
    format!(
        "[[limits]]\nprovider = \"openai\"\nmodel = \"{}\"\nrpm = {rpm}\nwindow_secs = {}\n\n\
         [[limits]]\nprovider = \"openai\"\nmodel = \"{}\"\nrpm = {NONBINDING_RPM}\n",
        model("binding"),
        WINDOW.as_secs(),
        model("nonbinding")
    )
}

/// Calls per command name since the server started (`INFO commandstats`).
async fn command_calls(redis_url: &str) -> anyhow::Result<HashMap<String, u64>> {
    let client = redis::Client::open(redis_url)?;
    let mut c = client.get_multiplexed_async_connection().await?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await?;
    Ok(agentq_fixtures::services::command_calls(&info))
}

fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>, script: bool) -> u64 {
    after
        .iter()
        .filter(|(k, _)| !script || k.starts_with("eval") || k.starts_with("fcall"))
        .map(|(k, v)| v.saturating_sub(before.get(k).copied().unwrap_or(0)))
        .sum()
}

/// What one round measured.
#[derive(Debug, Default, Clone, Copy)]
struct Round {
    iterations_per_s: f64,
    accepted: u64,
    refused: u64,
    /// Redis commands per iteration, and script calls per LLM request.
    commands_per_iteration: f64,
    scripts_per_call: f64,
}

async fn iterations(env: &Env, queue: &str) -> anyhow::Result<i64> {
    let (n,): (i64,) =
        sqlx::query_as("SELECT coalesce(sum(iteration), 0)::bigint FROM sessions WHERE queue = $1")
            .bind(queue)
            .fetch_one(env.store.pool())
            .await?;
    Ok(n)
}

async fn round(
    env: &Env,
    llm: &RateLimitedLlm,
    config_path: &std::path::Path,
    name: &str,
) -> anyhow::Result<Round> {
    let a = &env.args;
    let queue = env.queue(&format!("admission-{name}"));
    let mut s = spec(TURNS, BUILTIN);
    s.model = Some(model(name));
    let news: Vec<NewSession> = (0..a.admission_sessions)
        .map(|_| NewSession::root(s.clone(), &queue))
        .collect();
    let ids: Vec<String> = env
        .store
        .create_sessions(&news)
        .await?
        .into_iter()
        .map(|(r, _)| r.id)
        .collect();
    let redis = RedisQueue::connect(&env.redis_url).await?;
    enqueue(&redis, &queue, &ids).await?;
    let log = env.scratch.join(format!("admission-{name}-worker.log"));
    let base_url = format!("{}/v1", llm.url);
    let config = config_path.display().to_string();
    let concurrency = a.admission_sessions.to_string();
    let mut child = spawn_worker(
        env,
        &queue,
        &[
            "--concurrency",
            &concurrency,
            "--default-provider",
            "openai",
        ],
        &[
            ("OPENAI_BASE_URL", base_url.as_str()),
            ("OPENAI_API_KEY", "bench"),
            ("AGENTQ_CONFIG", config.as_str()),
        ],
        &log,
    )?;
    // Until the first iteration is committed: the worker is up and the sessions run.
    let ramp = Instant::now();
    while iterations(env, &queue).await? == 0 {
        check_alive(&mut child, &log)?;
        anyhow::ensure!(
            ramp.elapsed() < Duration::from_secs(120),
            "admission {name}: no iteration within 120 s (see {})",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if name == "binding" {
        let warm = Instant::now();
        while warm.elapsed() < WINDOW {
            tokio::time::sleep(Duration::from_millis(250)).await;
            check_alive(&mut child, &log)?;
        }
    }
    let m = model(name);
    let s0 = llm.model_stats(&m);
    let i0 = iterations(env, &queue).await?;
    let c0 = command_calls(&env.redis_url).await?;
    let t0 = Instant::now();
    let window = Duration::from_secs(a.admission_secs);
    while t0.elapsed() < window {
        tokio::time::sleep(Duration::from_millis(250)).await;
        check_alive(&mut child, &log)?;
    }
    let i1 = iterations(env, &queue).await?;
    let c1 = command_calls(&env.redis_url).await?;
    let s1 = llm.model_stats(&m);
    let dt = t0.elapsed().as_secs_f64();
    let _ = child.kill().await;
    let iters = u64::try_from(i1.saturating_sub(i0)).unwrap_or(0);
    let accepted = s1.accepted.saturating_sub(s0.accepted);
    let refused = s1.refused.saturating_sub(s0.refused);
    let calls = accepted.saturating_add(refused).max(1);
    let r = Round {
        iterations_per_s: iters as f64 / dt,
        accepted,
        refused,
        commands_per_iteration: delta(&c0, &c1, false) as f64 / iters.max(1) as f64,
        scripts_per_call: delta(&c0, &c1, true) as f64 / calls as f64,
    };
    progress(&format!(
        "admission {name}: {:.1} iterations/s, {accepted} requests accepted and {refused} \
         refused, {:.2} Redis commands per iteration, {:.2} script calls per LLM call",
        r.iterations_per_s, r.commands_per_iteration, r.scripts_per_call
    ));
    Ok(r)
}

pub async fn admission(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let rpm = env.args.admission_rpm;
    // The fake's own limit: the minute's allowance per window, as the limiter scales it.
    let per_window = rpm.saturating_mul(WINDOW.as_secs()).div_ceil(60).max(1);
    let llm = RateLimitedLlm::start(
        RateLimitedConfig::new(WINDOW, Limits::unlimited(), script())
            .model(&model("binding"), Limits::requests(per_window))
            .latency(LATENCY),
    )
    .await?;
    let config_path = env.scratch.join("admission.toml");
    std::fs::write(&config_path, config(rpm))
        .with_context(|| format!("writing {}", config_path.display()))?;
    let mut rounds = HashMap::new();
    for name in ROUNDS {
        rounds.insert(name, round(env, &llm, &config_path, name).await?);
    }
    let (b, nb, none) = (rounds["binding"], rounds["nonbinding"], rounds["none"]);
    let limit_per_s = rpm as f64 / 60.0;
    r.admission_rpm = Some(rpm);
    r.admission_iterations_per_s = Some(b.iterations_per_s);
    r.admission_limit_ratio = Some(b.iterations_per_s / limit_per_s);
    let calls = b.accepted.saturating_add(b.refused);
    r.admission_refused_share = Some(if calls == 0 {
        0.0
    } else {
        b.refused as f64 / calls as f64
    });
    r.admission_redis_calls_per_call = Some(b.scripts_per_call);
    r.admission_redis_commands_added_per_iteration =
        Some(nb.commands_per_iteration - none.commands_per_iteration);
    r.admission_nonbinding_iterations_per_s = Some(nb.iterations_per_s);
    r.admission_unlimited_iterations_per_s = Some(none.iterations_per_s);
    r.admission_nonbinding_ratio = Some(if none.iterations_per_s > 0.0 {
        nb.iterations_per_s / none.iterations_per_s
    } else {
        0.0
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn commandstats_are_read_per_command() {
        let info = "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=30,usec_per_call=2.5\r\n\
                    cmdstat_xadd:calls=7,usec=1,usec_per_call=0.1\r\ncmdstat_fcall:calls=1,usec=1\r\n";
        let after = agentq_fixtures::services::command_calls(info);
        assert_eq!(after["evalsha"], 12);
        assert_eq!(after["xadd"], 7);
        let before: HashMap<String, u64> = [("evalsha".to_string(), 2)].into();
        assert_eq!(delta(&before, &after, true), 11);
        assert_eq!(delta(&before, &after, false), 18);
    }

    #[test]
    fn the_configuration_limits_two_models_of_three() {
        let c = config(600);
        assert_eq!(c.matches("[[limits]]").count(), 2);
        assert!(c.contains("model = \"bench-admission-binding\"\nrpm = 600\nwindow_secs = 10\n"));
        assert!(!c.contains(&model("none")));
    }
}
