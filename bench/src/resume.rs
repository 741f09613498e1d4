//! The resume part: loading a long session and having its LLM request ready.

use std::time::{Duration, Instant};

use anyhow::bail;

use agentq_agent::provider::openai::{OpenAiConfig, OpenAiProvider};
use agentq_agent::state::Step;
use agentq_core::pg::PgStore;
use agentq_core::{Claim, LeaseStore, SessionStore};

use crate::env::Env;
use crate::report::{Results, ms, quantile};
use crate::workload::{Workload, run_workload, tools};

/// Load a 160-iteration session on a fresh store and have its LLM request ready: the
/// claim (row + history), the state, the request, and its OpenAI body.
pub async fn resume(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    let ran = run_workload(
        env,
        &Workload {
            part: "resume",
            tool: env.tool(),
            sessions: env.args.sessions.min(20),
            iterations: 160,
            warm_up: false,
            rounds: 1,
        },
    )
    .await?;
    let ids = ran.ids;
    // Make them resumable mid-way: drop the final answer, back to running at iteration 159.
    sqlx::query(
        "DELETE FROM messages m USING sessions s \
         WHERE s.id = ANY($1) AND m.root_id = s.root_id::uuid AND m.session_id = s.id::uuid \
           AND m.seq = (SELECT max(seq) FROM messages x \
                        WHERE x.root_id = m.root_id AND x.session_id = m.session_id)",
    )
    .bind(&ids)
    .execute(env.store.pool())
    .await?;
    sqlx::query(
        "UPDATE sessions SET status = 'queued', finish_reason = NULL, result = NULL, \
             error = NULL, finished_at = NULL, lease_owner = NULL, lease_expires_at = NULL, \
             iteration = iteration - 1, history_len = history_len - 1, attempts = 0 \
         WHERE id = ANY($1)",
    )
    .bind(&ids)
    .execute(env.store.pool())
    .await?;

    let store = PgStore::connect(&env.db_url, 2).await?;
    store.ping().await?;
    let specs = tools()
        .select(&[env.tool().to_string()])
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .specs();
    let openai = OpenAiProvider::new(OpenAiConfig {
        base_url: "http://127.0.0.1:9/v1".into(),
        api_key: None,
        ..OpenAiConfig::from_env()
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut times = Vec::new();
    let mut first = None;
    let mut messages = 0;
    for id in &ids {
        let t = Instant::now();
        let claim = store
            .claim(
                id,
                &format!("bench-{}-resume", env.run),
                Duration::from_secs(60),
                100,
            )
            .await?;
        let Claim::Acquired { mut state, .. } = claim else {
            bail!("resume: session {id} could not be claimed: {claim:?}");
        };
        state.normalize();
        let step = state.next_step(chrono::Utc::now());
        if !matches!(step, Step::CallLlm) {
            bail!(
                "resume: session {id} is not about to call the LLM ({step:?}, {} messages, iteration {})",
                state.messages.len(),
                state.iteration
            );
        }
        let request = state.request("gpt-4o-mini", &specs, None);
        let body = serde_json::to_vec(&openai.request_body(&request))?;
        let d = t.elapsed();
        std::hint::black_box(body);
        messages = state.messages.len();
        first.get_or_insert(d);
        times.push(d);
    }
    times.sort();
    r.resume_ms = quantile(&times, 0.5).map(ms);
    r.resume_first_ms = first.map(ms);
    r.resume_messages = Some(messages);
    Ok(())
}
