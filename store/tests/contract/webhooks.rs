//! Webhooks: the outbox rows the database writes with a session's change (only for a
//! tenant with a matching endpoint), their claim under a lease, the recording of attempts
//! fenced by the claim (delivered, retried, dead), redrive, the disabling of an endpoint
//! failing too long, and rotation. Every "now" is the test's.

use std::time::Duration;

use chrono::Utc;

use agentq_store::store::Store;
use agentq_types::webhook::{AttemptOutcome, DeliveryState, NewWebhook, RetryRule, WebhookEvent};

use crate::common::{contract_tests, new_session};

contract_tests!(contract_webhook_outbox_and_deliveries,);

fn endpoint(id: &str, tenant: &str, events: Vec<WebhookEvent>) -> NewWebhook {
    NewWebhook {
        id: id.into(),
        tenant: tenant.into(),
        url: "https://hooks.example.com/in".into(),
        events,
        queue: None,
        batch_id: None,
        description: Some("d".into()),
        secret_salt: "s1".into(),
        created_at: Utc::now(),
    }
}

fn failed(
    next: Option<chrono::DateTime<Utc>>,
    disable_after: Duration,
) -> (AttemptOutcome, RetryRule) {
    (
        AttemptOutcome::Failed {
            status: Some(500),
            error: "HTTP 500".into(),
        },
        RetryRule {
            next_attempt_at: next,
            disable_after,
        },
    )
}

async fn contract_webhook_outbox_and_deliveries(store: &dyn Store) {
    let day = Duration::from_secs(86_400);
    let events = vec![WebhookEvent::SessionCompleted, WebhookEvent::SessionFailed];
    assert!(
        store
            .create_webhook(&endpoint("wh_a", "acme", events.clone()), 2)
            .await
            .unwrap()
    );
    assert!(
        store
            .create_webhook(
                &endpoint("wh_b", "acme", vec![WebhookEvent::SessionWaiting]),
                2
            )
            .await
            .unwrap()
    );
    // The tenant's cap.
    assert!(
        !store
            .create_webhook(&endpoint("wh_c", "acme", events.clone()), 2)
            .await
            .unwrap()
    );
    assert_eq!(store.list_webhooks("acme").await.unwrap().len(), 2);
    assert!(store.list_webhooks("globex").await.unwrap().is_empty());
    let row = store.webhook("wh_a").await.unwrap().unwrap();
    assert_eq!((row.tenant.as_str(), row.events.clone()), ("acme", events));

    // Changes: a failure and a cancel of acme's, a failure of globex's (no endpoint).
    let (a1, _) = store
        .create_session(&new_session("a1").with_tenant("acme"))
        .await
        .unwrap();
    let (a2, _) = store
        .create_session(&new_session("a2").with_tenant("acme"))
        .await
        .unwrap();
    let (g1, _) = store
        .create_session(&new_session("g1").with_tenant("globex"))
        .await
        .unwrap();
    store.fail(&a1.id, "boom").await.unwrap();
    store.request_cancel(&a2.id).await.unwrap();
    store.fail(&g1.id, "boom").await.unwrap();
    let rows = store.list_deliveries("wh_a", None, None, 10).await.unwrap();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter()
            .all(|d| d.event == "session.failed" && d.state == DeliveryState::Pending)
    );
    let mut statuses: Vec<_> = rows.iter().map(|d| d.status.clone().unwrap()).collect();
    statuses.sort();
    assert_eq!(statuses, ["cancelled", "failed"]);
    assert!(
        store
            .list_deliveries("wh_b", None, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    // Paged newest first.
    let first = store.list_deliveries("wh_a", None, None, 1).await.unwrap();
    let next = store
        .list_deliveries("wh_a", None, Some(&first[0].id), 1)
        .await
        .unwrap();
    assert_eq!(next.len(), 1);
    assert!(next[0].id < first[0].id);

    // Claimed under a lease: not again until it ends.
    let now = Utc::now() + chrono::Duration::seconds(1);
    let claimed = store
        .claim_deliveries(now, Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    assert!(claimed.iter().all(|d| d.attempts == 1));
    assert!(
        store
            .claim_deliveries(now, Duration::from_secs(60), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let (d1, d2) = (&claimed[0], &claimed[1]);

    let rec = store
        .record_attempt(
            d1,
            now,
            &AttemptOutcome::Delivered { status: 204 },
            &failed(None, day).1,
        )
        .await
        .unwrap();
    assert!(rec.recorded && !rec.dead && !rec.disabled);
    let later = now + chrono::Duration::seconds(10);
    let (out, rule) = failed(Some(later), day);
    assert!(
        store
            .record_attempt(d2, now, &out, &rule)
            .await
            .unwrap()
            .recorded
    );
    assert!(
        store
            .claim_deliveries(now, Duration::from_secs(60), 10)
            .await
            .unwrap()
            .is_empty()
    );
    let again = store
        .claim_deliveries(later, Duration::from_secs(60), 10)
        .await
        .unwrap();
    assert_eq!((again.len(), again[0].attempts), (1, 2));
    // A claim that was taken over records nothing.
    assert!(
        !store
            .record_attempt(d2, later, &out, &rule)
            .await
            .unwrap()
            .recorded
    );
    // Out of retries: a dead letter; redriven, due again.
    let (out, rule) = failed(None, day);
    let rec = store
        .record_attempt(&again[0], later, &out, &rule)
        .await
        .unwrap();
    assert!(rec.recorded && rec.dead && !rec.disabled);
    let c = store.delivery_counts("wh_a").await.unwrap();
    assert_eq!((c.pending, c.delivered, c.dead), (0, 1, 1));
    let ep = store.webhook("wh_a").await.unwrap().unwrap();
    assert!(ep.failing_since.is_some());
    assert_eq!(ep.last_failure.as_deref(), Some("HTTP 500"));
    assert!(ep.last_success_at.is_some());
    assert_eq!(store.redrive_deliveries("wh_a", later).await.unwrap(), 1);
    let dead = store
        .list_deliveries("wh_a", Some(DeliveryState::Pending), None, 10)
        .await
        .unwrap();
    assert_eq!(dead.len(), 1);

    // Failing past `disable_after`: disabled, its pending ones dead, no new rows for it.
    let redriven = store
        .claim_deliveries(later, Duration::from_secs(60), 10)
        .await
        .unwrap();
    let (out, rule) = failed(Some(later), Duration::ZERO);
    let rec = store
        .record_attempt(&redriven[0], later, &out, &rule)
        .await
        .unwrap();
    assert!(rec.disabled);
    let ep = store.webhook("wh_a").await.unwrap().unwrap();
    assert!(ep.disabled_at.is_some());
    assert!(ep.disabled_reason.unwrap().contains("HTTP 500"));
    assert_eq!(store.delivery_counts("wh_a").await.unwrap().pending, 0);
    let (a3, _) = store
        .create_session(&new_session("a3").with_tenant("acme"))
        .await
        .unwrap();
    store.fail(&a3.id, "boom").await.unwrap();
    assert_eq!(
        store
            .list_deliveries("wh_a", None, None, 10)
            .await
            .unwrap()
            .len(),
        2
    );
    assert!(store.enable_webhook("wh_a").await.unwrap());
    let ep = store.webhook("wh_a").await.unwrap().unwrap();
    assert!(ep.disabled_at.is_none() && ep.failing_since.is_none());

    // Rotation keeps the old salt until its end.
    let until = later + chrono::Duration::hours(1);
    assert!(store.rotate_webhook("wh_a", "s2", until).await.unwrap());
    let ep = store.webhook("wh_a").await.unwrap().unwrap();
    assert_eq!(ep.secret_salt, "s2");
    assert_eq!(ep.old_secret_salt.as_deref(), Some("s1"));
    assert!(ep.old_expires_at.is_some());

    // Pruning keeps pending ones; deleting takes the rest.
    let far = later + chrono::Duration::days(30);
    assert!(store.prune_deliveries(far, 100).await.unwrap() >= 1);
    assert!(store.delete_webhook("wh_a").await.unwrap());
    assert!(!store.delete_webhook("wh_a").await.unwrap());
    assert!(store.webhook("wh_a").await.unwrap().is_none());
    assert_eq!(store.delivery_counts("wh_a").await.unwrap().delivered, 0);
}
