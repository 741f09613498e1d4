//! The listener's connection places: `max_connections` in all and
//! `max_connections_per_peer` from one peer, and which connections have not
//! authenticated a request yet (the ones a newer connection may take the place of).

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// Where a connection comes from, for `max_connections_per_peer`: an IPv4 address (an
/// IPv4-mapped IPv6 one counts as it), or the /64 of an IPv6 address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Peer {
    V4(Ipv4Addr),
    V6(u64),
}

impl Peer {
    pub(super) fn of(addr: SocketAddr) -> Peer {
        match addr.ip() {
            IpAddr::V4(a) => Peer::V4(a),
            IpAddr::V6(a) => match a.to_ipv4_mapped() {
                Some(v4) => Peer::V4(v4),
                None => Peer::V6((u128::from(a) >> 64) as u64),
            },
        }
    }
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Full {
    /// `max_connections`, every one authenticated.
    Total,
    /// `max_connections_per_peer`, every one of the peer's authenticated.
    Peer,
}

/// The listener's connections against `max_connections` and `max_connections_per_peer`,
/// and which of them have not authenticated a request (see the module docs).
#[derive(Debug)]
pub(super) struct Slots {
    pub(super) max_total: usize,
    pub(super) max_per_peer: usize,
    pub(super) state: Mutex<SlotState>,
}

#[derive(Debug, Default)]
pub(super) struct SlotState {
    next_id: u64,
    /// Every open connection by id (ids grow with each accept, so lower is older).
    open: HashMap<u64, Open>,
    /// The unauthenticated ones, oldest first.
    unauthenticated: BTreeSet<u64>,
    peers: HashMap<Peer, PeerSlots>,
}

#[derive(Debug)]
struct Open {
    peer: Peer,
    /// Cancelled to close the connection for a newer one.
    evicted: CancellationToken,
}

#[derive(Debug, Default)]
struct PeerSlots {
    open: usize,
    unauthenticated: BTreeSet<u64>,
}

/// A connection's place; dropping it (when the connection ends) frees it.
pub(super) struct Slot {
    slots: Arc<Slots>,
    pub(super) id: u64,
    pub(super) evicted: CancellationToken,
}

impl Slots {
    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a new connection from `peer`, closing the oldest unauthenticated
    /// connection (the peer's own when the peer is at its cap) if that is what it takes.
    pub(super) fn take_slot(self: &Arc<Self>, peer: Peer) -> Result<Slot, Full> {
        let mut st = self.lock();
        let peer_open = st.peers.get(&peer).map_or(0, |p| p.open);
        if peer_open >= self.max_per_peer {
            let victim = st
                .peers
                .get(&peer)
                .and_then(|p| p.unauthenticated.first().copied())
                .ok_or(Full::Peer)?;
            st.evict(victim);
        }
        if st.open.len() >= self.max_total {
            let victim = st.unauthenticated.first().copied().ok_or(Full::Total)?;
            st.evict(victim);
        }
        let id = st.next_id;
        st.next_id = st.next_id.wrapping_add(1);
        let evicted = CancellationToken::new();
        st.open.insert(
            id,
            Open {
                peer,
                evicted: evicted.clone(),
            },
        );
        st.unauthenticated.insert(id);
        let p = st.peers.entry(peer).or_default();
        p.open = p.open.saturating_add(1);
        p.unauthenticated.insert(id);
        Ok(Slot {
            slots: self.clone(),
            id,
            evicted,
        })
    }

    /// Connection `id` carried a request that did not pass the key check: it may be
    /// closed for a newer one again (the oldest such first: its id).
    pub(super) fn unauthenticated(&self, id: u64) {
        let mut st = self.lock();
        let Some(peer) = st.open.get(&id).map(|o| o.peer) else {
            return;
        };
        st.unauthenticated.insert(id);
        if let Some(p) = st.peers.get_mut(&peer) {
            p.unauthenticated.insert(id);
        }
    }

    /// Connection `id` carried a request that passed the key check: it is not closed for
    /// a newer one while its requests go on passing it.
    pub(super) fn authenticated(&self, id: u64) {
        let mut st = self.lock();
        let Some(peer) = st.open.get(&id).map(|o| o.peer) else {
            return;
        };
        st.unauthenticated.remove(&id);
        if let Some(p) = st.peers.get_mut(&peer) {
            p.unauthenticated.remove(&id);
        }
    }
}

impl SlotState {
    /// Forget connection `id` (its place is free at once) and tell it to close.
    fn evict(&mut self, id: u64) {
        if let Some(o) = self.remove(id) {
            tracing::debug!(peer = ?o.peer, "closing an unauthenticated connection for a new one");
            o.evicted.cancel();
        }
    }

    fn remove(&mut self, id: u64) -> Option<Open> {
        let o = self.open.remove(&id)?;
        self.unauthenticated.remove(&id);
        if let Some(p) = self.peers.get_mut(&o.peer) {
            p.open = p.open.saturating_sub(1);
            p.unauthenticated.remove(&id);
            if p.open == 0 {
                self.peers.remove(&o.peer);
            }
        }
        Some(o)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Gone already when it was evicted.
        self.slots.lock().remove(self.id);
    }
}
