//! Webhooks on the sharded store. The outbox is written by each shard's triggers, in the
//! transaction of the session change, from the endpoints that shard holds: so an endpoint
//! is written on the control shard (which decides, and which the API reads) and copied
//! to every other shard. Deliveries are claimed from every shard and each attempt is
//! recorded on the shard its delivery came from. An endpoint's failure streak is counted
//! per shard (each copy is disabled by its own shard's failures); the API sees the copies
//! as one (disabled when any is), and enabling it enables every copy.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::ShardedStore;
use super::merge::{cap, merge_pages};
use crate::error::Result;
use crate::store::{Store, WebhookStore};
use crate::webhook::{
    AttemptOutcome, DeliveryCounts, DeliveryRow, DeliveryState, NewWebhook, Recorded, RetryRule,
    WebhookRow,
};

impl<S: Store> ShardedStore<S> {
    /// Record the attempt on whichever shard holds the delivery.
    async fn record_anywhere(
        &self,
        delivery: &DeliveryRow,
        now: DateTime<Utc>,
        outcome: &AttemptOutcome,
        rule: &RetryRule,
    ) -> Result<Recorded> {
        let mut last = Recorded {
            recorded: false,
            dead: false,
            disabled: false,
        };
        for i in 0..self.len() {
            last = self
                .on(i)
                .record_attempt(delivery, now, outcome, rule)
                .await?;
            if last.recorded {
                break;
            }
        }
        Ok(last)
    }

    /// The shards other than the control shard.
    fn copies(&self) -> impl Iterator<Item = usize> {
        1..self.len()
    }

    /// `f` on every copy, then on the control shard, whose answer is returned.
    async fn on_every<'a, T, F, Fut>(&'a self, f: F) -> Result<T>
    where
        F: Fn(&'a S) -> Fut,
        Fut: std::future::Future<Output = Result<T>> + 'a,
    {
        let copies = self.copies().map(|i| f(self.on(i)));
        futures::future::try_join_all(copies).await?;
        f(self.control()).await
    }
}

/// An endpoint as the API shows it, from its copies (the control shard's first): disabled
/// when any copy is, with the latest failure and success any copy saw and the earliest
/// unbroken failure streak.
fn seen_as_one(mut copies: impl Iterator<Item = WebhookRow>) -> Option<WebhookRow> {
    let mut row = copies.next()?;
    for c in copies {
        if row.disabled_at.is_none() && c.disabled_at.is_some() {
            row.disabled_at = c.disabled_at;
            row.disabled_reason = c.disabled_reason.clone();
        }
        if c.last_failure_at > row.last_failure_at {
            row.last_failure_at = c.last_failure_at;
            row.last_failure = c.last_failure.clone();
        }
        row.last_success_at = row.last_success_at.max(c.last_success_at);
        row.failing_since = match (row.failing_since, c.failing_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    Some(row)
}

#[async_trait]
impl<S: Store> WebhookStore for ShardedStore<S> {
    /// The control shard counts the tenant's endpoints and decides; then the copies. A
    /// copy that fails to be written takes the endpoint away again (from every shard), so
    /// no shard announces to an endpoint the API does not show.
    async fn create_webhook(&self, new: &NewWebhook, max: u32) -> Result<bool> {
        if !self.control().create_webhook(new, max).await? {
            return Ok(false);
        }
        let copies = self
            .copies()
            .map(|i| self.on(i).create_webhook(new, u32::MAX));
        if let Err(e) = futures::future::try_join_all(copies).await {
            let _ = self.on_every(|s| s.delete_webhook(&new.id)).await;
            return Err(e);
        }
        Ok(true)
    }

    async fn webhook(&self, id: &str) -> Result<Option<WebhookRow>> {
        let copies = self.each(|s| s.webhook(id)).await?;
        Ok(seen_as_one(copies.into_iter().flatten()))
    }

    async fn list_webhooks(&self, tenant: &str) -> Result<Vec<WebhookRow>> {
        let lists = self.each(|s| s.list_webhooks(tenant)).await?;
        let mut lists = lists.into_iter();
        let control = lists.next().unwrap_or_default();
        let copies: Vec<WebhookRow> = lists.flatten().collect();
        Ok(control
            .into_iter()
            .filter_map(|row| {
                let id = row.id.clone();
                let same = copies.iter().filter(move |c| c.id == id).cloned();
                seen_as_one(std::iter::once(row).chain(same))
            })
            .collect())
    }

    async fn delete_webhook(&self, id: &str) -> Result<bool> {
        self.on_every(|s| s.delete_webhook(id)).await
    }

    async fn rotate_webhook(&self, id: &str, salt: &str, old_until: DateTime<Utc>) -> Result<bool> {
        self.on_every(|s| s.rotate_webhook(id, salt, old_until))
            .await
    }

    async fn enable_webhook(&self, id: &str) -> Result<bool> {
        self.on_every(|s| s.enable_webhook(id)).await
    }

    async fn disable_webhook(&self, id: &str, now: DateTime<Utc>, reason: &str) -> Result<bool> {
        self.on_every(|s| s.disable_webhook(id, now, reason)).await
    }

    async fn delivery_counts(&self, id: &str) -> Result<DeliveryCounts> {
        let mut total = DeliveryCounts::default();
        for c in self.each(|s| s.delivery_counts(id)).await? {
            total.pending += c.pending;
            total.delivered += c.delivered;
            total.dead += c.dead;
        }
        Ok(total)
    }

    /// Newest first: delivery ids begin with the event's time.
    async fn list_deliveries(
        &self,
        id: &str,
        state: Option<DeliveryState>,
        cursor: Option<&str>,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>> {
        let pages = self
            .each(|s| s.list_deliveries(id, state, cursor, limit))
            .await?;
        Ok(merge_pages(pages, |d| d.id.clone(), true, cap(limit)))
    }

    async fn redrive_deliveries(&self, id: &str, now: DateTime<Utc>) -> Result<u64> {
        self.sum(|s| s.redrive_deliveries(id, now)).await
    }

    async fn claim_deliveries(
        &self,
        now: DateTime<Utc>,
        lease: Duration,
        limit: u32,
    ) -> Result<Vec<DeliveryRow>> {
        let lists = self.each(|s| s.claim_deliveries(now, lease, limit)).await?;
        let mut out = Vec::new();
        if let Ok(mut from) = self.deliveries.lock() {
            for (i, list) in lists.into_iter().enumerate() {
                for d in list {
                    from.insert(d.id.clone(), i);
                    out.push(d);
                }
            }
        }
        Ok(out)
    }

    /// On the shard it was claimed from; a delivery this process did not claim (another
    /// scheduler's, after a restart) is looked for on every shard.
    async fn record_attempt(
        &self,
        delivery: &DeliveryRow,
        now: DateTime<Utc>,
        outcome: &AttemptOutcome,
        rule: &RetryRule,
    ) -> Result<Recorded> {
        let known = self
            .deliveries
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&delivery.id));
        let recorded = match known {
            Some(i) => {
                self.on(i)
                    .record_attempt(delivery, now, outcome, rule)
                    .await?
            }
            None => self.record_anywhere(delivery, now, outcome, rule).await?,
        };
        if recorded.disabled {
            // One shard's streak disabled its copy: every copy stops announcing.
            let reason = match self.webhook(&delivery.endpoint_id).await? {
                Some(row) => row.disabled_reason.unwrap_or_default(),
                None => String::new(),
            };
            let others = (0..self.len()).map(|i| {
                self.on(i)
                    .disable_webhook(&delivery.endpoint_id, now, &reason)
            });
            futures::future::try_join_all(others).await?;
        }
        Ok(recorded)
    }

    async fn announce_batches(&self, now: DateTime<Utc>, limit: u32) -> Result<u64> {
        self.sum(|s| s.announce_batches(now, limit)).await
    }

    async fn prune_deliveries(&self, before: DateTime<Utc>, limit: u32) -> Result<u64> {
        self.sum(|s| s.prune_deliveries(before, limit)).await
    }
}
