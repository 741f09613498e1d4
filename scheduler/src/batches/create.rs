//! Creating a checked batch: its spool read back a chunk at a time into the store's one
//! transaction ([`agentq_core::batch::BatchStore::create_batch`]), each session placed as
//! a batch's sessions are (its batch id and cap; held for the dispatcher or not, per
//! queue, as `POST /v1/sessions/batch` decides it), then the sessions not held enqueued.
//! A refusal the store finds (a repeated `custom_id`, an idempotency key in use) names
//! the item where the client wrote it.

use std::collections::BTreeMap;

use async_trait::async_trait;

use agentq_api::{BatchCounts, BatchStatus, BatchView};
use agentq_core::auth::Caller;
use agentq_core::batch::{BatchCreate, BatchItem, BatchSource, ItemRefused, NewBatch};

use crate::actions::enqueue;
use crate::error::ApiError;
use crate::http::body::path;
use crate::state::Scheduler;

use super::spool::SpoolReader;
use super::upload::Checked;

/// Items per chunk handed to the store, and spooled bytes per chunk at most.
const CHUNK_ITEMS: usize = 1_000;
const CHUNK_BYTES: usize = 8 * 1024 * 1024;

/// The spool as the store reads it: each item placed in the batch, the ids to enqueue
/// kept (only of queues not held, so at most what their buffers have room for while a
/// dispatcher runs), and where each item of the last chunk was written, to name a refused
/// one.
struct Placed<'a> {
    spool: SpoolReader,
    batch_id: String,
    max_running: Option<u32>,
    capped: bool,
    held: &'a BTreeMap<String, bool>,
    enqueue: BTreeMap<String, Vec<String>>,
    /// Items handed out before the last chunk, and where the last chunk's were written.
    before: u64,
    at: Vec<String>,
    /// Why reading the spool failed (the store is told only that it did).
    failed: Option<ApiError>,
}

#[async_trait]
impl BatchSource for Placed<'_> {
    async fn next_chunk(&mut self) -> agentq_core::Result<Option<Vec<BatchItem>>> {
        self.before = self
            .before
            .saturating_add(u64::try_from(self.at.len()).unwrap_or(u64::MAX));
        self.at.clear();
        let mut chunk = Vec::new();
        let mut bytes = 0usize;
        while chunk.len() < CHUNK_ITEMS && bytes < CHUNK_BYTES {
            let next = match self.spool.next().await {
                Ok(next) => next,
                Err(e) => {
                    self.failed = Some(e);
                    return Err(agentq_core::Error::Conflict(
                        "the batch spool failed".into(),
                    ));
                }
            };
            let Some((entry, size)) = next else {
                break;
            };
            bytes = bytes.saturating_add(size);
            let mut session = entry.session;
            // In the batch's partition: a batch and its sessions live on one shard.
            session.id = agentq_core::shard::id_beside(&self.batch_id);
            session.root_id = session.id.clone();
            let held = self.held.get(&session.queue).copied().unwrap_or(false);
            session.sched.batch_id = Some(self.batch_id.clone());
            session.sched.batch_max_running = self.max_running;
            session.sched.held = held;
            session.sched.capped = self.capped;
            if !held {
                self.enqueue
                    .entry(session.queue.clone())
                    .or_default()
                    .push(session.id.clone());
            }
            self.at.push(entry.at);
            chunk.push(BatchItem {
                session,
                custom_id: entry.custom_id,
            });
        }
        Ok((!chunk.is_empty()).then_some(chunk))
    }
}

impl Placed<'_> {
    /// Where item `index` of the batch was written (it is in the last chunk).
    fn at(&self, index: u64) -> String {
        index
            .checked_sub(self.before)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.at.get(i).cloned())
            .unwrap_or_else(|| format!("item {index}"))
    }
}

/// Create the batch `checked` describes for `caller`: its view as created.
pub(crate) async fn create(
    s: &Scheduler,
    caller: &Caller,
    checked: Checked,
) -> Result<BatchView, ApiError> {
    let Checked {
        spool,
        items,
        per_queue,
        options,
    } = checked;
    let batch = NewBatch {
        id: agentq_core::new_session_id(),
        tenant: caller.tenant.clone(),
        metadata: options.metadata,
        max_running: options.max_running,
    };
    let held: BTreeMap<String, bool> = per_queue
        .iter()
        .map(|(q, n)| {
            let held = s.dispatch().hold(q, &caller.tenant, *n, batch.max_running);
            (q.clone(), held)
        })
        .collect();
    let mut placed = Placed {
        spool,
        batch_id: batch.id.clone(),
        max_running: batch.max_running,
        capped: s.dispatch().capped(&caller.tenant, batch.max_running),
        held: &held,
        enqueue: BTreeMap::new(),
        before: 0,
        at: Vec::new(),
        failed: None,
    };
    let made = {
        // A turn among the batches written at once, for the transaction only (the
        // semaphore is never closed: an error would be a bug).
        let _turn = s
            .batch_writes
            .acquire()
            .await
            .map_err(|_| ApiError::Internal)?;
        s.store.create_batch(&batch, &mut placed).await
    };
    let made = match made {
        Ok(made) => made,
        Err(e) => return Err(placed.failed.take().unwrap_or_else(|| e.into())),
    };
    let total = match made {
        BatchCreate::Created { items } => items,
        BatchCreate::Refused { index, reason } => return Err(refused(&placed.at(index), reason)),
    };
    let any_held = held.values().any(|h| *h);
    tracing::info!(
        batch_id = %batch.id,
        tenant = %caller.tenant,
        sessions = total,
        spooled = items,
        held = any_held,
        "batch created"
    );
    for (queue, ids) in &placed.enqueue {
        enqueue(s, queue, ids).await;
    }
    if any_held {
        s.dispatch().nudge();
    }
    // The stored creation time (the database's clock), as every later read shows it.
    let created_at = match s.store.batch(&batch.id).await {
        Ok(Some(row)) => row.created_at,
        _ => chrono::Utc::now(),
    };
    Ok(BatchView {
        id: batch.id,
        status: BatchStatus::InProgress,
        total,
        counts: BatchCounts {
            queued: total,
            ..BatchCounts::default()
        },
        finish_reasons: BTreeMap::new(),
        usage: Default::default(),
        cost_usd: None,
        metadata: batch.metadata,
        max_running: batch.max_running,
        created_at,
        started_at: None,
        finished_at: None,
        cancelled_at: None,
        eta_secs: None,
    })
}

/// An item the store would not create, named where the client wrote it.
fn refused(at: &str, reason: ItemRefused) -> ApiError {
    match reason {
        ItemRefused::CustomIdRepeated => ApiError::invalid(
            path(at, "custom_id"),
            "is an earlier item's: a custom_id names one item of its batch",
        ),
        ItemRefused::IdempotencyKeyUsed { session_id } => ApiError::ConflictOn {
            field: path(at, "idempotency_key"),
            message: format!(
                "the idempotency key names session {session_id} already: a batch holds only \
                 sessions it creates"
            ),
        },
    }
}
