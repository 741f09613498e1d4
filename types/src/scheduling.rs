//! Scheduling across tenants: a session's placement (priority, batch, cap, whether it
//! waits in the store for the dispatcher) and the dispatcher's choice of which waiting
//! sessions enter a queue's delivery buffer next ([`choose`]): priority first, then
//! weighted fair share across tenants, then fair share across the batches of a tenant,
//! never past a tenant's or a batch's cap on sessions running or buffered.
//!
//! The choice is pure: the store answers what waits ([`Candidate`]) and what is active
//! ([`ActiveCount`]), the scheduler decides here and moves the chosen rows.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

/// Lowest and highest priority; higher runs first.
pub const MIN_PRIORITY: u8 = 0;
pub const MAX_PRIORITY: u8 = 9;
/// What a session that names no priority gets.
pub const DEFAULT_PRIORITY: u8 = 5;

pub fn default_priority() -> u8 {
    DEFAULT_PRIORITY
}

/// Where a new session goes in the scheduling order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    pub priority: u8,
    /// The batch request that created it.
    pub batch_id: Option<String>,
    /// At most this many sessions of the batch running or buffered at once.
    pub batch_max_running: Option<u32>,
    /// Stored without a stream entry: the dispatcher adds it when its turn comes.
    pub held: bool,
    /// Its tenant or batch has a cap on running sessions: held for the dispatcher again
    /// whenever it is queued again after a wait (see [`crate::model::SessionRow::capped`]).
    pub capped: bool,
}

impl Default for Placement {
    fn default() -> Self {
        Placement {
            priority: DEFAULT_PRIORITY,
            batch_id: None,
            batch_max_running: None,
            held: false,
            capped: false,
        }
    }
}

/// A held session, as the dispatcher reads it: `rank` is its place (from 1) among the
/// held sessions of its (tenant, batch) group, best first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    pub tenant: String,
    pub batch_id: Option<String>,
    pub priority: u8,
    pub batch_max_running: Option<u32>,
    pub rank: u32,
}

/// Sessions of one (queue, tenant, batch) that are running, or queued with an entry
/// (the buffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveCount {
    pub queue: String,
    pub tenant: String,
    pub batch_id: Option<String>,
    pub running: u64,
    pub buffered: u64,
}

/// How one tenant is scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantShare {
    /// Its share relative to other tenants' (at least 1).
    pub weight: u32,
    /// At most this many of its sessions running or buffered at once.
    pub max_running: Option<u32>,
}

impl Default for TenantShare {
    fn default() -> Self {
        TenantShare {
            weight: 1,
            max_running: None,
        }
    }
}

type GroupKey = (String, Option<String>);

/// How a group's head ranks: (priority, tenant load after it, tenant weight, batch load,
/// id); see [`before`].
type Score<'a> = (u8, u64, u32, u64, &'a str);

struct Group {
    tenant: String,
    batch_cap: Option<u32>,
    /// Its candidates, best first (by their rank).
    queue: Vec<Candidate>,
    next: usize,
}

/// Up to `room` of `candidates`, in the order they should enter the buffer.
///
/// Each step takes the head of one (tenant, batch) group: the highest priority among the
/// heads; among equal priorities the tenant with the fewest sessions active (running,
/// buffered, or chosen in this call) per unit of weight; within it, the batch with the
/// fewest active; then the oldest id. A group whose tenant or batch reached its cap gives
/// nothing more. `active` counts every queue (a cap holds across queues).
pub fn choose(
    candidates: Vec<Candidate>,
    active: &[ActiveCount],
    share: impl Fn(&str) -> TenantShare,
    room: usize,
) -> Vec<String> {
    let mut tenant_active: HashMap<String, u64> = HashMap::new();
    let mut batch_active: HashMap<GroupKey, u64> = HashMap::new();
    for a in active {
        let n = a.running.saturating_add(a.buffered);
        let t = tenant_active.entry(a.tenant.clone()).or_default();
        *t = t.saturating_add(n);
        let b = batch_active
            .entry((a.tenant.clone(), a.batch_id.clone()))
            .or_default();
        *b = b.saturating_add(n);
    }
    let mut groups: BTreeMap<GroupKey, Group> = BTreeMap::new();
    for c in candidates {
        let key = (c.tenant.clone(), c.batch_id.clone());
        let g = groups.entry(key).or_insert_with(|| Group {
            tenant: c.tenant.clone(),
            batch_cap: c.batch_max_running,
            queue: Vec::new(),
            next: 0,
        });
        g.queue.push(c);
    }
    for g in groups.values_mut() {
        g.queue
            .sort_by(|a, b| a.rank.cmp(&b.rank).then_with(|| a.id.cmp(&b.id)));
    }
    let shares: HashMap<String, TenantShare> = groups
        .values()
        .map(|g| (g.tenant.clone(), share(&g.tenant)))
        .collect();

    let mut out = Vec::with_capacity(room.min(1024));
    while out.len() < room {
        let mut best: Option<(&GroupKey, Score)> = None;
        for (key, g) in &groups {
            let Some(head) = g.queue.get(g.next) else {
                continue;
            };
            let t_n = tenant_active.get(&g.tenant).copied().unwrap_or(0);
            let b_n = batch_active.get(key).copied().unwrap_or(0);
            let s = shares.get(&g.tenant).copied().unwrap_or_default();
            if s.max_running.is_some_and(|cap| t_n >= u64::from(cap))
                || g.batch_cap.is_some_and(|cap| b_n >= u64::from(cap))
            {
                continue;
            }
            let weight = s.weight.max(1);
            let score = (
                head.priority,
                t_n.saturating_add(1),
                weight,
                b_n,
                head.id.as_str(),
            );
            let better = match &best {
                None => true,
                Some((_, cur)) => before(&score, cur),
            };
            if better {
                best = Some((key, score));
            }
        }
        let Some((key, _)) = best else {
            break;
        };
        let key = key.clone();
        let Some(g) = groups.get_mut(&key) else {
            break;
        };
        let Some(head) = g.queue.get(g.next) else {
            break;
        };
        out.push(head.id.clone());
        g.next = g.next.saturating_add(1);
        let t = tenant_active.entry(g.tenant.clone()).or_default();
        *t = t.saturating_add(1);
        let b = batch_active.entry(key).or_default();
        *b = b.saturating_add(1);
    }
    out
}

/// Whether score `a` goes before `b`: higher priority; then the lower tenant load per
/// weight (`load_a / w_a < load_b / w_b`, compared by cross-multiplying); then the
/// batch with fewer active; then the older id.
fn before(a: &Score, b: &Score) -> bool {
    if a.0 != b.0 {
        return a.0 > b.0;
    }
    let lhs = u128::from(a.1) * u128::from(b.2);
    let rhs = u128::from(b.1) * u128::from(a.2);
    if lhs != rhs {
        return lhs < rhs;
    }
    if a.3 != b.3 {
        return a.3 < b.3;
    }
    a.4 < b.4
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: &str, tenant: &str, batch: Option<&str>, priority: u8, rank: u32) -> Candidate {
        Candidate {
            id: id.into(),
            tenant: tenant.into(),
            batch_id: batch.map(Into::into),
            priority,
            batch_max_running: None,
            rank,
        }
    }

    fn flood(tenant: &str, batch: Option<&str>, n: u32) -> Vec<Candidate> {
        (1..=n)
            .map(|i| {
                c(
                    &format!("{tenant}-{i:04}"),
                    tenant,
                    batch,
                    DEFAULT_PRIORITY,
                    i,
                )
            })
            .collect()
    }

    #[test]
    fn tenants_alternate_whatever_their_backlog() {
        let mut all = flood("a", None, 100);
        all.extend(flood("b", None, 3));
        let got = choose(all, &[], |_| TenantShare::default(), 6);
        assert_eq!(
            got,
            ["a-0001", "b-0001", "a-0002", "b-0002", "a-0003", "b-0003"]
        );
    }

    #[test]
    fn a_tenant_with_sessions_running_waits_for_one_without() {
        let all = [flood("a", None, 10), flood("b", None, 10)].concat();
        let active = [ActiveCount {
            queue: "default".into(),
            tenant: "a".into(),
            batch_id: None,
            running: 3,
            buffered: 0,
        }];
        let got = choose(all, &active, |_| TenantShare::default(), 4);
        assert_eq!(got, ["b-0001", "b-0002", "b-0003", "a-0001"]);
    }

    #[test]
    fn weights_share_in_proportion() {
        let all = [flood("a", None, 50), flood("b", None, 50)].concat();
        let got = choose(
            all,
            &[],
            |t| TenantShare {
                weight: if t == "a" { 3 } else { 1 },
                max_running: None,
            },
            40,
        );
        let a = got.iter().filter(|id| id.starts_with("a-")).count();
        assert_eq!(a, 30, "{got:?}");
    }

    #[test]
    fn priority_comes_first() {
        let mut all = flood("a", None, 5);
        all.push(c("b-high", "b", None, 9, 1));
        all.push(c("b-low", "b", None, 1, 2));
        let got = choose(all, &[], |_| TenantShare::default(), 7);
        assert_eq!(got[0], "b-high");
        assert_eq!(got[6], "b-low");
    }

    #[test]
    fn batches_of_a_tenant_alternate() {
        let mut all = flood("a", Some("x"), 10);
        all.extend((1..=2).map(|i| c(&format!("y{i}"), "a", Some("y"), DEFAULT_PRIORITY, i)));
        let got = choose(all, &[], |_| TenantShare::default(), 4);
        assert_eq!(got, ["a-0001", "y1", "a-0002", "y2"]);
    }

    #[test]
    fn caps_hold_counting_what_is_active() {
        let mut all = flood("a", Some("x"), 10);
        for cand in &mut all {
            cand.batch_max_running = Some(3);
        }
        all.extend(flood("b", None, 10));
        let active = [ActiveCount {
            queue: "other".into(),
            tenant: "a".into(),
            batch_id: Some("x".into()),
            running: 1,
            buffered: 1,
        }];
        let got = choose(
            all,
            &active,
            |t| TenantShare {
                weight: 1,
                max_running: (t == "b").then_some(4),
            },
            100,
        );
        assert_eq!(got.iter().filter(|id| id.starts_with("a-")).count(), 1);
        assert_eq!(got.iter().filter(|id| id.starts_with("b-")).count(), 4);
    }

    #[test]
    fn nothing_to_choose_or_no_room() {
        assert!(choose(Vec::new(), &[], |_| TenantShare::default(), 10).is_empty());
        assert!(choose(flood("a", None, 3), &[], |_| TenantShare::default(), 0).is_empty());
    }
}
