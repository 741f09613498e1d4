//! Connections per API key: each connection counts once against every key that
//! authenticated a request on it ([`Connection::bind`]), until it closes, and tells the
//! connection places whether its current request passed the key check.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::ApiError;

use super::answer::RETRY_AFTER_SECS;
use super::slots::Slots;

/// Most distinct API keys one connection may carry requests of: each counts the
/// connection against its own cap, so switching keys on one connection buys nothing.
const MAX_KEYS_PER_CONNECTION: usize = 16;

/// Connections per API key, across the listener: a connection counts once for every key
/// that authenticated a request on it, until it closes. A key is only known after its
/// first request, so this caps what one key holds; the total cap bounds the rest.
#[derive(Debug)]
pub(super) struct KeyConnections {
    pub(super) max_per_key: usize,
    pub(super) open: Mutex<HashMap<String, usize>>,
}

/// The connection a request came on (a request extension): the authentication layer
/// counts it against the caller's key with [`Connection::bind`].
#[derive(Clone, Debug)]
pub struct Connection(Arc<ConnectionKeys>);

#[derive(Debug)]
struct ConnectionKeys {
    registry: Arc<KeyConnections>,
    keys: Mutex<Vec<String>>,
    slots: Arc<Slots>,
    id: u64,
    /// The request being served passed the key check (HTTP/1.1 serves a connection's
    /// requests one at a time).
    passed: AtomicBool,
}

impl Connection {
    pub(super) fn new(registry: Arc<KeyConnections>, slots: Arc<Slots>, id: u64) -> Self {
        Connection(Arc::new(ConnectionKeys {
            registry,
            keys: Mutex::new(Vec::new()),
            slots,
            id,
            passed: AtomicBool::new(false),
        }))
    }

    /// A request on this connection passed the key check: the connection is no longer
    /// one a newer connection may take the place of.
    pub fn authenticated(&self) {
        self.0.passed.store(true, Ordering::Relaxed);
        self.0.slots.authenticated(self.0.id);
    }

    /// A request starts: it has not passed the key check yet.
    pub(super) fn request_started(&self) {
        self.0.passed.store(false, Ordering::Relaxed);
    }

    /// A request was answered (its head): one that did not pass the key check leaves the
    /// connection one a newer connection may take the place of. Otherwise an attacker
    /// keeps connections it authenticated once for good, past its key's revocation,
    /// with requests that need no key every `header_read_timeout`.
    pub(super) fn request_answered(&self) {
        if !self.0.passed.load(Ordering::Relaxed) {
            self.0.slots.unauthenticated(self.0.id);
        }
    }

    /// Count this connection for `key`, once; a 503 when the key already holds its cap
    /// of connections or the connection has carried too many keys (the caller then
    /// closes it).
    pub fn bind(&self, key: &str) -> Result<(), ApiError> {
        let mut keys = self.0.keys.lock().unwrap_or_else(|e| e.into_inner());
        if keys.iter().any(|k| k == key) {
            return Ok(());
        }
        let overloaded = |message: String| ApiError::Overloaded {
            message,
            retry_after: RETRY_AFTER_SECS,
        };
        if keys.len() >= MAX_KEYS_PER_CONNECTION {
            return Err(overloaded(format!(
                "one connection carries the requests of at most {MAX_KEYS_PER_CONNECTION} API keys"
            )));
        }
        let registry = &self.0.registry;
        let mut open = registry.open.lock().unwrap_or_else(|e| e.into_inner());
        let held = open.get(key).copied().unwrap_or(0);
        if held >= registry.max_per_key {
            return Err(overloaded(format!(
                "this API key holds {} open connections, the most it may \
                 (scheduler.max_connections_per_key); close one or retry later",
                registry.max_per_key
            )));
        }
        open.insert(key.to_string(), held + 1);
        keys.push(key.to_string());
        Ok(())
    }
}

impl Drop for ConnectionKeys {
    fn drop(&mut self) {
        let keys = std::mem::take(self.keys.get_mut().unwrap_or_else(|e| e.into_inner()));
        let mut open = self.registry.open.lock().unwrap_or_else(|e| e.into_inner());
        for key in keys {
            crate::events::caps::release(&mut open, &key);
        }
    }
}
