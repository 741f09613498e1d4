//! Work of this process taken together in rounds, per key: what arrives for a key while a
//! round of that key is in flight waits and goes in the next round, all of it at once (one
//! transaction and one commit, as the group commit does for checkpoints); what finds
//! nothing in flight goes at once, alone. A key's rounds run on a task of their own, so a
//! caller that gives up waiting (its session cancelled) never leaves the others behind a
//! round nobody runs.
//!
//! Used by a tenant's budget holds and settlements ([`super::tenant_rounds`]) and by the
//! marks of finished sessions announced ([`super::announce_rounds`]).

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

/// The keys with a round in flight, and what waits for their next one. A key is present
/// exactly while its task runs.
pub(crate) struct Rounds<T> {
    waiting: Mutex<HashMap<String, Vec<T>>>,
}

impl<T> Default for Rounds<T> {
    fn default() -> Self {
        Rounds {
            waiting: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> std::fmt::Debug for Rounds<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rounds").finish_non_exhaustive()
    }
}

impl<T: Send + 'static> Rounds<T> {
    /// Queue `item` for `key`'s next round, starting the key's task (which runs `round` on
    /// each round's items) if none runs.
    pub(crate) fn submit<F, Fut>(self: &Arc<Self>, key: &str, item: T, round: F)
    where
        F: Fn(Vec<T>) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send,
    {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(items) = waiting.get_mut(key) {
            items.push(item);
            return;
        }
        waiting.insert(key.to_string(), vec![item]);
        drop(waiting);
        let (rounds, key) = (self.clone(), key.to_string());
        tokio::spawn(async move { rounds.run(&key, round).await });
    }

    /// Rounds until nothing waits: each takes everything queued since the last.
    async fn run<F, Fut>(&self, key: &str, round: F)
    where
        F: Fn(Vec<T>) -> Fut,
        Fut: Future<Output = ()>,
    {
        loop {
            let items = {
                let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
                match waiting.get_mut(key) {
                    Some(items) if !items.is_empty() => std::mem::take(items),
                    _ => {
                        waiting.remove(key);
                        return;
                    }
                }
            };
            round(items).await;
        }
    }
}
