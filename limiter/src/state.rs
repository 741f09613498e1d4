//! The limiter's state as the admin route reads it from Redis: every rule key in use with
//! its counts, and the holds not yet past.

use std::collections::HashMap;

use agentq_error::Result;
use agentq_types::limiter::{HoldState, LimiterState, RuleState};

use crate::clock::now_ms;
use crate::keys::{Keys, SINGLE_TAG, live_tags};

/// Read the limiter's state from Redis (the admin route): every rule key in use with
/// its counts, and the holds not yet past; of one server's layout and of every tag a
/// cluster's workers listed (give it a cluster connection on a cluster).
pub async fn read_state<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
) -> Result<LimiterState> {
    let mut tags = live_tags(conn, now_ms()).await?;
    tags.insert(0, SINGLE_TAG.to_string());
    let mut state = LimiterState {
        rules: Vec::new(),
        holds: Vec::new(),
    };
    for tag in tags {
        let one = read_tag(conn, &Keys::of(&tag)).await?;
        state.rules.extend(one.rules);
        state.holds.extend(one.holds);
    }
    state.holds.sort_by(|a, b| a.key.cmp(&b.key));
    state.rules.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(state)
}

async fn read_tag<C: redis::aio::ConnectionLike + Send>(
    conn: &mut C,
    tag: &Keys,
) -> Result<LimiterState> {
    let now = now_ms();
    let keys: Vec<String> = redis::cmd("SMEMBERS")
        .arg(&tag.index)
        .query_async(conn)
        .await?;
    let mut rules = Vec::new();
    let mut gone = Vec::new();
    for k in keys {
        let cfg: HashMap<String, u64> = redis::cmd("HGETALL")
            .arg(format!("{k}:cfg"))
            .query_async(conn)
            .await?;
        if cfg.is_empty() {
            // Expired: no call used the rule for a window and a reservation's life.
            gone.push(k);
            continue;
        }
        let window_ms = cfg.get("window_ms").copied().unwrap_or(60_000);
        let since = now.saturating_sub(i64::try_from(window_ms).unwrap_or(i64::MAX));
        let (requests, in_flight, tokens): (u64, u64, Option<i64>) = redis::pipe()
            .cmd("ZCOUNT")
            .arg(format!("{k}:r"))
            .arg(format!("({since}"))
            .arg("+inf")
            .cmd("ZCOUNT")
            .arg(format!("{k}:c"))
            .arg(format!("({now}"))
            .arg("+inf")
            .cmd("GET")
            .arg(format!("{k}:tt"))
            .query_async(conn)
            .await?;
        rules.push(RuleState {
            key: k
                .strip_prefix(tag.prefix.as_str())
                .unwrap_or(&k)
                .to_string(),
            requests_per_window: cfg.get("rpm").copied().unwrap_or(0),
            tokens_per_window: cfg.get("tpm").copied().unwrap_or(0),
            concurrency: cfg.get("concurrency").copied().unwrap_or(0),
            window_ms,
            requests,
            tokens: tokens.unwrap_or(0),
            in_flight,
        });
    }
    if !gone.is_empty() {
        let _: redis::RedisResult<i64> = redis::cmd("SREM")
            .arg(&tag.index)
            .arg(&gone)
            .query_async(conn)
            .await;
    }
    let held: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(&tag.holds)
        .query_async(conn)
        .await?;
    let mut holds: Vec<HoldState> = held
        .into_iter()
        .filter(|(_, until)| *until > now)
        .filter_map(|(key, until)| {
            Some(HoldState {
                key,
                until: chrono::DateTime::from_timestamp_millis(until)?,
            })
        })
        .collect();
    holds.sort_by(|a, b| a.key.cmp(&b.key));
    rules.sort_by(|a, b| a.key.cmp(&b.key));
    Ok(LimiterState { rules, holds })
}
