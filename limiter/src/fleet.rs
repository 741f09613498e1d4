//! What a connected [`Limiter`] exchanges with the fleet in the background: connecting,
//! reading the fleet's holds (and renewing the slots of long calls) every
//! [`HOLD_REFRESH`], and writing the settlements no reservation carried.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, IntoConnectionInfo};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use agentq_error::Result;
use agentq_types::config::LimitSettings;

use crate::clock::now_ms;
use crate::keys::{ANNOUNCED_KEY, HOLDS_KEY, MAX_FIELDS};
use crate::limiter::Limiter;
use crate::script::Ask;

/// How often a worker reads the fleet's learned holds.
pub const HOLD_REFRESH: Duration = Duration::from_millis(250);
/// Redis answers a limiter waits for; past this the call goes (fail open).
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A settlement waits this long for the next reservation of its worker to carry it
/// (so that a call costs one round trip, not two) before it is written on its own. What
/// waits is only a correction of counted tokens and of the learned output size; a slot
/// wanted back, a hold and what the provider announced go at once.
pub(crate) const SETTLE_DELAY: Duration = Duration::from_secs(1);

impl Limiter {
    /// Connect to Redis at `url` and start reading the fleet's holds and writing this
    /// worker's settlements until `cancel` (or until the limiter is dropped).
    pub async fn connect(
        url: &str,
        limits: &[LimitSettings],
        cancel: CancellationToken,
    ) -> Result<Arc<Limiter>> {
        let client = Client::open(url.into_connection_info()?)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_with_config(client, config).await?;
        let limiter = Arc::new(Limiter::new(limits, Some(conn))?);
        // Loaded up front, so that no call's round trip is the one refused for an unknown
        // script and sent again with its text.
        if let Some(mut c) = limiter.conn.clone() {
            let loaded: redis::RedisResult<String> =
                limiter.script.prepare_invoke().load_async(&mut c).await;
            if let Err(e) = loaded {
                limiter.failed_open("loading its script", &e);
            }
        }
        tokio::spawn(refresh_holds(Arc::downgrade(&limiter), cancel.clone()));
        tokio::spawn(write_settlements(
            Arc::downgrade(&limiter),
            limiter.flush.clone(),
            cancel,
        ));
        Ok(limiter)
    }
}

/// Read the fleet's holds every [`HOLD_REFRESH`] into the limiter, and renew the slots of
/// long calls, until cancelled or the limiter is gone.
async fn refresh_holds(limiter: Weak<Limiter>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(HOLD_REFRESH) => {}
            _ = cancel.cancelled() => return,
        }
        let Some(l) = limiter.upgrade() else { return };
        let Some(mut conn) = l.conn.clone() else {
            return;
        };
        let mut pipe = redis::pipe();
        pipe.cmd("HGETALL")
            .arg(HOLDS_KEY)
            .cmd("HGETALL")
            .arg(ANNOUNCED_KEY);
        for (id, keys, until) in l.due_renewals(now_ms()) {
            for k in keys {
                // XX: a slot already given back (or expired and taken) is not revived.
                pipe.cmd("ZADD")
                    .arg(format!("{k}:c"))
                    .arg("XX")
                    .arg("GT")
                    .arg(until)
                    .arg(&id)
                    .ignore();
            }
        }
        let read: redis::RedisResult<(HashMap<String, i64>, HashMap<String, i64>)> =
            pipe.query_async(&mut conn).await;
        match read {
            Ok((remote, announced)) => {
                {
                    let mut a = l.announced.write().unwrap_or_else(|e| e.into_inner());
                    // Past the bound, what the fleet forgot is forgotten here too (fields
                    // noted since the last write come back with their write).
                    if a.len() > MAX_FIELDS {
                        a.retain(|f| announced.contains_key(f));
                    }
                    a.extend(announced.into_keys());
                }
                let now = now_ms();
                let mut holds = l.holds.write().unwrap_or_else(|e| e.into_inner());
                holds.retain(|_, until| *until > now);
                for (k, until) in remote {
                    if until > now {
                        let cur = holds.entry(k).or_insert(until);
                        *cur = (*cur).max(until);
                    }
                }
            }
            Err(e) => l.failed_open("reading holds", &e),
        }
    }
}

/// Write the settlements no reservation carried: at once when one is urgent, else after
/// [`SETTLE_DELAY`] (an urgent one arriving meanwhile cuts the wait short). On cancel,
/// what is left is written before it returns.
async fn write_settlements(limiter: Weak<Limiter>, flush: Arc<Notify>, cancel: CancellationToken) {
    loop {
        let mut stop = tokio::select! {
            _ = flush.notified() => false,
            _ = cancel.cancelled() => true,
        };
        let deadline = tokio::time::Instant::now() + SETTLE_DELAY;
        while !stop {
            match limiter.upgrade() {
                Some(l) if l.urgent.swap(false, Ordering::Relaxed) => break,
                Some(_) => {}
                None => return,
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => break,
                _ = flush.notified() => {}
                _ = cancel.cancelled() => stop = true,
            }
        }
        let Some(l) = limiter.upgrade() else { return };
        l.round_trip(Ask::Nothing, "settle").await;
        if stop {
            return;
        }
    }
}
