//! Tenants, their idempotency keys and API keys, and named queues.

use chrono::{SubsecRound, Utc};

use agentq_error::Error;
use agentq_store::QueueCreate;
use agentq_store::store::Store;
use agentq_types::model::ListFilter;

use crate::common::{contract_tests, new_session};

contract_tests!(
    contract_tenants_and_their_idempotency_keys,
    contract_api_keys,
    contract_created_queues,
);

async fn contract_tenants_and_their_idempotency_keys(store: &dyn Store) {
    let mut a = new_session("acme's").with_tenant("acme");
    a.idempotency_key = Some("order-42".into());
    a.idempotency_hash = Some("h1".into());
    let mut b = new_session("globex's").with_tenant("globex");
    b.idempotency_key = Some("order-42".into());
    b.idempotency_hash = Some("h2".into());
    let (ra, created) = store.create_session(&a).await.unwrap();
    assert!(created);
    assert_eq!(ra.tenant, "acme");
    assert_eq!(ra.idempotency_hash.as_deref(), Some("h1"));
    // The same key in another tenant is another session.
    let (rb, created) = store.create_session(&b).await.unwrap();
    assert!(created, "another tenant's key is independent");
    assert_ne!(rb.id, ra.id);
    assert_eq!(rb.tenant, "globex");
    // A repeat within the tenant returns the first row (with its hash, for the caller to
    // compare), in a batch too.
    let mut again = new_session("acme's again").with_tenant("acme");
    again.idempotency_key = Some("order-42".into());
    again.idempotency_hash = Some("h3".into());
    let (r, created) = store.create_session(&again).await.unwrap();
    assert!(!created);
    assert_eq!(
        (r.id.as_str(), r.idempotency_hash.as_deref()),
        (ra.id.as_str(), Some("h1"))
    );
    let fresh = new_session("new").with_tenant("globex");
    let out = store
        .create_sessions(&[again.clone(), fresh.clone(), b.clone()])
        .await
        .unwrap();
    assert_eq!(out[0].0.id, ra.id);
    assert!(!out[0].1);
    assert!(out[1].1);
    assert_eq!(out[1].0.tenant, "globex");
    assert_eq!((out[2].0.id.as_str(), out[2].1), (rb.id.as_str(), false));
    // The default tenant.
    let (d, _) = store.create_session(&new_session("plain")).await.unwrap();
    assert_eq!(d.tenant, agentq_types::auth::DEFAULT_TENANT);

    // Listing by tenant, with cursors that never cross into another tenant.
    let only = |tenant: &str, cursor: Option<String>| ListFilter {
        tenant: Some(tenant.into()),
        limit: 10,
        cursor,
        ..Default::default()
    };
    let acme = store.list(&only("acme", None)).await.unwrap();
    assert_eq!(
        acme.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        [ra.id.as_str()]
    );
    let globex = store.list(&only("globex", None)).await.unwrap();
    assert_eq!(globex.len(), 2);
    assert!(globex.iter().all(|r| r.tenant == "globex"));
    let after = store
        .list(&only("globex", Some(d.id.clone())))
        .await
        .unwrap();
    assert!(after.iter().all(|r| r.tenant == "globex"));
    let all = store
        .list(&ListFilter {
            limit: 10,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 4);
}

async fn contract_api_keys(store: &dyn Store) {
    use agentq_types::auth::{self, Scope};
    let (new, key) = auth::generate(
        "acme",
        vec![Scope::SessionsRead, Scope::SessionsWrite],
        Some("ci".into()),
        Some(Utc::now().trunc_subsecs(6) + chrono::Duration::days(1)),
    )
    .unwrap();
    let stored = store.create_key(&new).await.unwrap();
    assert_eq!(stored.id, new.id);
    assert_eq!(stored.tenant, "acme");
    assert_eq!(stored.scopes, new.scopes);
    assert_eq!(stored.label.as_deref(), Some("ci"));
    assert_eq!(stored.expires_at, new.expires_at);
    assert!(stored.revoked_at.is_none());
    // Only the hash is stored, and the key checks against it.
    assert_ne!(stored.secret_hash, key);
    assert!(!stored.secret_hash.contains(&key[3..]));
    let found = store.key(auth::key_id(&key).unwrap()).await.unwrap();
    assert_eq!(found.as_ref(), Some(&stored));
    assert_eq!(
        auth::verify(&key, found.as_ref(), Utc::now())
            .unwrap()
            .tenant,
        "acme"
    );
    assert!(store.key("000000000000").await.unwrap().is_none());
    // The same id again is a conflict, not a second row.
    assert!(matches!(
        store.create_key(&new).await,
        Err(Error::Conflict(_))
    ));

    let (other, _) = auth::generate("globex", vec![Scope::Admin], None, None).unwrap();
    store.create_key(&other).await.unwrap();
    let listed = store.list_keys().await.unwrap();
    assert_eq!(
        listed.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
        [new.id.as_str(), other.id.as_str()]
    );

    let revoked = store.revoke_key(&new.id).await.unwrap().unwrap();
    let at = revoked.revoked_at.expect("revoked");
    assert!(auth::verify(&key, Some(&revoked), Utc::now()).is_err());
    // Revoking again keeps the first time.
    let again = store.revoke_key(&new.id).await.unwrap().unwrap();
    assert_eq!(again.revoked_at, Some(at));
    assert!(store.revoke_key("nope").await.unwrap().is_none());
    assert_eq!(
        store.key(&new.id).await.unwrap().unwrap().revoked_at,
        Some(at)
    );
}

/// Queues an admin creates: stored once, listed oldest first, none past the limit.
async fn contract_created_queues(store: &dyn Store) {
    assert!(store.stored_queues().await.unwrap().is_empty());
    assert_eq!(
        store.create_queue("bulk", 2).await.unwrap(),
        QueueCreate::Created
    );
    assert_eq!(
        store.create_queue("bulk", 2).await.unwrap(),
        QueueCreate::Exists
    );
    assert_eq!(
        store.create_queue("gpu", 2).await.unwrap(),
        QueueCreate::Created
    );
    assert_eq!(
        store.create_queue("more", 2).await.unwrap(),
        QueueCreate::Full
    );
    // An existing one is reported as such even at the limit.
    assert_eq!(
        store.create_queue("gpu", 2).await.unwrap(),
        QueueCreate::Exists
    );
    assert_eq!(store.stored_queues().await.unwrap(), ["bulk", "gpu"]);
    assert_eq!(store.create_queue("x", 0).await.unwrap(), QueueCreate::Full);
}
