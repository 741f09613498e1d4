//! What a connected [`Limiter`] exchanges with the fleet in the background: connecting,
//! reading the fleet's holds (and renewing the slots of long calls) every
//! [`HOLD_REFRESH`], and writing the settlements no reservation carried.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{Client, IntoConnectionInfo};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use agentq_error::Result;
use agentq_types::config::{LimitSettings, LimiterSection};

use crate::clock::now_ms;
use crate::conn::Conn;
use crate::keys::{Keys, MAX_FIELDS, SINGLE_TAG, TAG_IDLE_MS, TAG_RENEW_MS, live_tags, tag_in};
use crate::limiter::Limiter;

/// How often a worker reads the fleet's learned holds.
pub const HOLD_REFRESH: Duration = Duration::from_millis(250);
/// How long a call under a configured rule waits while Redis cannot be reached (with
/// `on_unavailable = "closed"`) before it asks again.
pub const CLOSED_RETRY: Duration = Duration::from_secs(1);
/// Redis answers a limiter waits for; past this it counts as unreachable.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A settlement waits this long for the next reservation of its worker to carry it
/// (so that a call costs one round trip, not two) before it is written on its own. What
/// waits is only a correction of counted tokens and of the learned output size; a slot
/// wanted back, a hold and what the provider announced go at once.
pub(crate) const SETTLE_DELAY: Duration = Duration::from_secs(1);

impl Limiter {
    /// Connect to Redis at `url` (one server, `[limiter]` at its defaults) and start
    /// reading the fleet's holds and writing this worker's settlements until `cancel` (or
    /// until the limiter is dropped).
    pub async fn connect(
        url: &str,
        limits: &[LimitSettings],
        cancel: CancellationToken,
    ) -> Result<Arc<Limiter>> {
        Self::connect_with(url, false, &LimiterSection::default(), limits, cancel).await
    }

    /// As [`Limiter::connect`], to a Redis Cluster when `cluster` (`url` then holds one or
    /// more seed nodes, comma-separated), and doing what `settings` says while Redis
    /// cannot be reached.
    pub async fn connect_with(
        url: &str,
        cluster: bool,
        settings: &LimiterSection,
        limits: &[LimitSettings],
        cancel: CancellationToken,
    ) -> Result<Arc<Limiter>> {
        let conn = if cluster {
            let mut seeds = Vec::new();
            for u in url.split(',').map(str::trim).filter(|u| !u.is_empty()) {
                seeds.push(u.into_connection_info()?);
            }
            let client = ClusterClientBuilder::new(seeds)
                .connection_timeout(CONNECT_TIMEOUT)
                .response_timeout(COMMAND_TIMEOUT)
                .retries(1)
                .build()?;
            Conn::Cluster(client.get_async_connection().await?)
        } else {
            let client = Client::open(url.into_connection_info()?)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(COMMAND_TIMEOUT))
                .set_number_of_retries(1)
                .set_max_delay(Duration::from_millis(200));
            Conn::Single(ConnectionManager::new_with_config(client, config).await?)
        };
        let mut limiter = Limiter::new(limits, Some(conn))?;
        limiter.on_unavailable = settings.on_unavailable;
        let limiter = Arc::new(limiter);
        // Loaded up front (on every node of a cluster), so that no call's round trip is
        // the one refused for an unknown script and sent again with its text.
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

    /// The tags whose holds this worker reads: the one tag on one server, every tag the
    /// fleet listed on a cluster and used within its idle time.
    async fn tags_in_use(&self, conn: &mut Conn) -> redis::RedisResult<Vec<String>> {
        if !self.cluster {
            return Ok(vec![SINGLE_TAG.to_string()]);
        }
        live_tags(conn, now_ms()).await
    }

    /// Whether the keys of the listed tags are due to be renewed (every
    /// [`TAG_RENEW_MS`]); `true` marks them renewed now.
    fn keep_due(&self, now: i64) -> bool {
        let last = self.tags_kept.load(Ordering::Relaxed);
        now.saturating_sub(last) >= TAG_RENEW_MS
            && self
                .tags_kept
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
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
        let tags = match l.tags_in_use(&mut conn).await {
            Ok(t) => t,
            Err(e) => {
                l.failed_open("reading holds", &e);
                continue;
            }
        };
        let mut renewals = l.due_renewals(now_ms());
        // Not taken while nothing is listed: a worker's first read comes before its first
        // call lists a tag, and would have put the renewal off for an hour.
        let keep = l.cluster && !tags.is_empty() && l.keep_due(now_ms());
        let mut remote: HashMap<String, i64> = HashMap::new();
        let mut announced: HashMap<String, i64> = HashMap::new();
        let mut failed = false;
        for tag in &tags {
            // One pipeline per tag: one slot each.
            let keys = Keys::of(tag);
            let mut pipe = redis::pipe();
            pipe.cmd("HGETALL")
                .arg(&keys.holds)
                .cmd("HGETALL")
                .arg(&keys.announced);
            renew_in(&mut pipe, &mut renewals, Some(tag));
            if keep {
                // A listed tag's keys outlive its last use by the listing's idle time,
                // then expire with no one to renew them.
                for key in keys.kept() {
                    pipe.cmd("PEXPIRE").arg(key).arg(TAG_IDLE_MS).ignore();
                }
            }
            let read: redis::RedisResult<(HashMap<String, i64>, HashMap<String, i64>)> =
                pipe.query_async(&mut conn).await;
            match read {
                Ok((h, a)) => {
                    remote.extend(h);
                    announced.extend(a);
                }
                Err(e) => {
                    failed = true;
                    l.failed_open("reading holds", &e);
                }
            }
        }
        // Slots of tags not listed yet (a worker's first call on a key races its listing).
        while !renewals.is_empty() {
            let mut pipe = redis::pipe();
            renew_in(&mut pipe, &mut renewals, None);
            let done: redis::RedisResult<()> = pipe.query_async(&mut conn).await;
            if let Err(e) = done {
                l.failed_open("renewing slots", &e);
                break;
            }
        }
        if failed {
            continue;
        }
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
}

/// Add to `pipe` the renewals of slots under `tag` (all of one tag, the first's, when
/// `None`), taking them out of `renewals`.
fn renew_in(
    pipe: &mut redis::Pipeline,
    renewals: &mut Vec<(String, Vec<String>, i64)>,
    tag: Option<&str>,
) {
    let tag = match tag {
        Some(t) => t.to_string(),
        None => match renewals
            .iter()
            .flat_map(|(_, keys, _)| keys.iter())
            .find_map(|k| tag_in(k))
        {
            Some(t) => t.to_string(),
            None => {
                renewals.clear();
                return;
            }
        },
    };
    for (id, keys, until) in renewals.iter_mut() {
        keys.retain(|k| {
            if tag_in(k) != Some(tag.as_str()) {
                return true;
            }
            // XX: a slot already given back (or expired and taken) is not revived.
            pipe.cmd("ZADD")
                .arg(format!("{k}:c"))
                .arg("XX")
                .arg("GT")
                .arg(*until)
                .arg(&*id)
                .ignore();
            false
        });
    }
    renewals.retain(|(_, keys, _)| !keys.is_empty());
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
        l.settle_all().await;
        if stop {
            return;
        }
    }
}
