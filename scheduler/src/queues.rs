//! The queue registry: which queues sessions may name, and which are known to exist.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use agentq_core::{Queue, QueueStore};

use crate::error::ApiError;

/// The queues sessions may name, and those whose stream and consumer group are known to
/// exist (so each is created once per process rather than on every request). A queue is
/// known when it is configured or an admin created it (stored, so every scheduler learns
/// it); callers cannot invent queues, each of which is a Redis stream and a metrics label
/// value. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct QueueRegistry {
    configured: Arc<Vec<String>>,
    /// Admin-created queues learned from the store.
    created: Arc<Mutex<HashSet<String>>>,
    ensured: Arc<Mutex<HashSet<String>>>,
    /// No caller can create queues here (a keyless `agentq dev`): an unknown queue is
    /// then pointed to the setting alone, not to an admin route nobody may call.
    settings_only: bool,
}

impl QueueRegistry {
    pub fn new(configured: Vec<String>) -> Self {
        QueueRegistry {
            configured: Arc::new(configured),
            created: Arc::default(),
            ensured: Arc::default(),
            settings_only: false,
        }
    }

    /// A registry of a server without admin callers (see [`QueueRegistry::settings_only`]).
    pub fn settings_only(mut self) -> Self {
        self.settings_only = true;
        self
    }

    pub fn is_configured(&self, name: &str) -> bool {
        self.configured.iter().any(|q| q == name)
    }

    /// Remember an admin-created queue.
    pub fn learn(&self, name: &str) {
        self.created
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string());
    }

    /// How many queues may be stored when at most `max_queues` may exist in all.
    pub fn room_for_created(&self, max_queues: usize) -> usize {
        max_queues.saturating_sub(self.configured.len())
    }

    /// Every known queue, configured ones first (asks the store for created ones).
    pub async fn known(&self, store: &dyn QueueStore) -> agentq_core::Result<Vec<String>> {
        let mut names: Vec<String> = self.configured.to_vec();
        for q in store.stored_queues().await? {
            self.learn(&q);
            if !names.contains(&q) {
                names.push(q);
            }
        }
        Ok(names)
    }

    /// A 422 naming `field` unless sessions may name `queue`. A queue this process has not
    /// seen is looked up in the store (another scheduler may have created it).
    pub async fn check_known(
        &self,
        store: &dyn QueueStore,
        queue: &str,
        field: &str,
    ) -> Result<(), ApiError> {
        let learned = || {
            self.created
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(queue)
        };
        if self.is_configured(queue) || learned() {
            return Ok(());
        }
        self.known(store).await?;
        if learned() {
            return Ok(());
        }
        let message = if self.settings_only {
            format!(
                "unknown queue {queue:?}: the queues are configured by `scheduler.queues` in \
                 agentq.toml (or `agentq dev --queues`)"
            )
        } else {
            format!(
                "unknown queue {queue:?}: name one of `scheduler.queues` (agentq.toml) or one \
                 an admin created (POST /v1/queues)"
            )
        };
        Err(ApiError::invalid(field, message))
    }

    fn is_ensured(&self, name: &str) -> bool {
        self.ensured
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
    }

    /// Create the queue's group unless done already. A failure is logged and not
    /// remembered: the next call tries again (and `enqueue` creates a missing group too).
    pub async fn ensure(&self, queue: &dyn Queue, name: &str) -> bool {
        if self.is_ensured(name) {
            return true;
        }
        match queue.ensure_queue(name).await {
            Ok(()) => {
                self.ensured
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(name.to_string());
                true
            }
            Err(e) => {
                tracing::warn!(queue = name, error = %e, "cannot create the consumer group yet");
                false
            }
        }
    }

    /// Configured queues, admin-created ones this process learned, and those it created
    /// a group for since (the sweeper's, for sessions stored before queues were checked).
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.configured.iter().cloned().collect();
        for set in [&self.created, &self.ensured] {
            for n in set.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                if !names.contains(n) {
                    names.push(n.clone());
                }
            }
        }
        names
    }

    /// Ensure every configured queue; true when all exist.
    pub async fn ensure_configured(&self, queue: &dyn Queue) -> bool {
        let mut all = true;
        for name in self.configured.iter() {
            all &= self.ensure(queue, name).await;
        }
        all
    }
}
