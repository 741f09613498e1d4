//! Adding a shard, against three real Postgres servers: `record_shard_map` (what
//! `agentq migrate` calls) adds a generation to the map on the control shard; the trees
//! written before stay where they are and are found there, new roots spread over every
//! shard, a child joins its root's shard, a keyed submit retried across the change finds
//! its first session, an id minted before the map (random bits where the generation is)
//! is not read anew, and a process short of the new shard's URL refuses rather than
//! misroutes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use agentq_agent::spec::SessionSpec;
use agentq_error::Error;
use agentq_store::pg::{PgStore, record_shard_map};
use agentq_store::sharded::{Probe, ShardedStore};
use agentq_store::{SessionStore, ShardStore};
use agentq_types::model::{NewSession, new_session_id};
use agentq_types::shard::{GENERATIONS, ShardMap, id_beside, key_partition, mint_generation};

use crate::common::assert_one_shard_per_call;

async fn three_shards() -> Vec<PgStore> {
    crate::common::pg_shards(3).await
}

fn root(prompt: &str) -> NewSession {
    NewSession::root(SessionSpec::new(prompt), "default")
}

/// `n` roots created through `store`, with the ids `mint` gives, theirs as stored.
async fn roots(store: &dyn SessionStore, n: usize, mint: impl Fn() -> String) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let mut new = root(&format!("root {i}"));
        new.id = mint();
        new.root_id = new.id.clone();
        ids.push(store.create_session(&new).await.unwrap().0.id);
    }
    ids
}

/// The shard whose database holds `id`.
async fn holder(shards: &[PgStore], id: &str) -> usize {
    let mut on = Vec::new();
    for (i, s) in shards.iter().enumerate() {
        if s.get(id).await.unwrap().is_some() {
            on.push(i);
        }
    }
    assert_eq!(on.len(), 1, "{id} is on shards {on:?}");
    on[0]
}

/// A key whose partition is on another shard in generation 1 (over 3) than in 0 (over 2).
fn moving_key() -> String {
    (0..)
        .map(|i| format!("order-{i}"))
        .find(|k| {
            let p = usize::from(key_partition("acme", k));
            p % 2 != p % 3
        })
        .unwrap()
}

/// An id of a build before the map: random bits, here those of generation 1.
fn legacy_id_naming_generation_1() -> String {
    loop {
        let id = uuid::Uuid::now_v7().to_string();
        let b = uuid::Uuid::parse_str(&id).unwrap().into_bytes();
        if (u16::from_be_bytes([b[14], b[15]]) >> 10) & 0xF == 1 {
            return id;
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_shard_added_takes_new_trees_and_leaves_the_old_ones_where_they_are() {
    let shards = three_shards().await;
    let two = shards[..2].to_vec();
    let first = record_shard_map(&two).await.unwrap();
    assert_eq!(first.map, ShardMap::uniform(2));
    assert_eq!(first.added, vec![0]);
    assert!(record_shard_map(&two).await.unwrap().added.is_empty());

    // Before: two shards. Roots, a child, a keyed submit and an id of an older build.
    let before = ShardedStore::open(two.clone()).await.unwrap();
    assert_eq!(mint_generation(), 0);
    let old = roots(&before, 16, new_session_id).await;
    let key = moving_key();
    let keyed = root("keyed").with_tenant("acme").with_idempotency_key(&key);
    let (first_keyed, created) = before.create_session(&keyed).await.unwrap();
    assert!(created);
    let mut legacy = root("legacy");
    legacy.id = legacy_id_naming_generation_1();
    legacy.root_id = legacy.id.clone();
    let legacy = before.create_session(&legacy).await.unwrap().0;
    let mut where_before = Vec::new();
    for id in old.iter().chain([&first_keyed.id, &legacy.id]) {
        where_before.push(holder(&shards, id).await);
    }
    assert!(where_before.iter().all(|i| *i < 2));

    // A process given the third shard's URL before the map names it: allowed, and it
    // sends no tree there yet.
    let staged = ShardedStore::open(shards.clone())
        .await
        .unwrap()
        .with_map_reread(Duration::ZERO);
    let early = staged.create_session(&root("staged")).await.unwrap().0;
    assert!(holder(&shards, &early.id).await < 2);

    // The shard is added.
    let added = record_shard_map(&shards).await.unwrap();
    assert_eq!(added.added, vec![1]);
    assert_eq!(added.map.shards(), 3);

    // The staged process reads the map on its next call and mints in generation 1.
    staged.get(&early.id).await.unwrap().unwrap();
    assert_eq!(mint_generation(), 1);

    // A process started now: every old tree found where it was, one shard per call.
    let probe = Arc::new(Probe::new());
    let after = ShardedStore::open(shards.clone())
        .await
        .unwrap()
        .with_probe(probe.clone());
    for (id, was) in old
        .iter()
        .chain([&first_keyed.id, &legacy.id])
        .zip(&where_before)
    {
        assert_eq!(after.get(id).await.unwrap().unwrap().id, *id);
        assert_eq!(after.index(id), *was, "{id} moved");
    }
    assert_one_shard_per_call(&probe);

    // New roots over all three shards; children beside their roots, the legacy one's too.
    let mut on = BTreeSet::new();
    for id in roots(&after, 60, new_session_id).await {
        on.insert(holder(&shards, &id).await);
    }
    assert_eq!(on, BTreeSet::from([0, 1, 2]));
    for parent in [&old[0], &legacy.id] {
        let mut child = root("child");
        child.id = id_beside(parent);
        child.parent_id = Some(parent.clone());
        child.root_id = parent.clone();
        child.depth = 1;
        let child = after.create_session(&child).await.unwrap().0;
        assert_eq!(
            holder(&shards, &child.id).await,
            holder(&shards, parent).await
        );
    }

    // The keyed submit retried: the first session, not a second one on the key's new shard.
    let retry = root("keyed").with_tenant("acme").with_idempotency_key(&key);
    assert_ne!(
        after.index(&retry.id),
        holder(&shards, &first_keyed.id).await
    );
    let (again, created) = after.create_session(&retry).await.unwrap();
    assert!(!created);
    assert_eq!(again.id, first_keyed.id);
    let mut holders = 0;
    for s in &shards {
        holders += usize::from(s.session_with_key("acme", &key).await.unwrap().is_some());
    }
    assert_eq!(holders, 1);
    assert_one_shard_per_call(&probe);

    // A process without the third shard refuses to start; one started before the shard
    // was added refuses a session there instead of looking on the wrong shard.
    let err = ShardedStore::open(two.clone()).await.unwrap_err();
    assert!(err.to_string().contains("database_url names 2"), "{err}");
    let on_third = loop {
        let id = after.create_session(&root("third")).await.unwrap().0.id;
        if holder(&shards, &id).await == 2 {
            break id;
        }
    };
    let err = before.get(&on_third).await.unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    assert!(err.to_string().contains("database_url"), "{err}");

    // Taking a shard away is refused, and the map is as it was.
    let err = record_shard_map(&two).await.unwrap_err();
    assert!(err.to_string().contains("cannot be left out"), "{err}");
    assert_eq!(shards[0].shard_generations().await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_first_map_keeps_one_databases_sessions_where_they_are() {
    let shards = three_shards().await;
    // One Postgres ran alone, with a build before the map: random bits in its ids.
    let ids = roots(&shards[0], 24, || uuid::Uuid::now_v7().to_string()).await;
    let two = shards[..2].to_vec();
    let recorded = record_shard_map(&two).await.unwrap();
    assert_eq!(recorded.added, vec![0, 1]);
    assert_eq!(recorded.map.generations()[0].shards, 1);
    let store = ShardedStore::open(two).await.unwrap();
    for id in &ids {
        assert_eq!(store.index(id), 0, "{id}");
        assert!(store.get(id).await.unwrap().is_some());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_map_has_at_most_its_generations() {
    let three = three_shards().await;
    // The same databases given again stand for the shards added: only the count matters.
    let list: Vec<PgStore> = (0..=usize::from(GENERATIONS))
        .map(|i| three[i % 3].clone())
        .collect();
    record_shard_map(&list[..1]).await.unwrap();
    for n in 2..=usize::from(GENERATIONS) {
        assert_eq!(record_shard_map(&list[..n]).await.unwrap().added.len(), 1);
    }
    let err = record_shard_map(&list).await.unwrap_err();
    assert!(err.to_string().contains("no shard can be added"), "{err}");
    assert_eq!(
        three[0].shard_generations().await.unwrap().len(),
        usize::from(GENERATIONS)
    );
}
