//! Schedules: a due schedule is leased to one claimer at a time (another claimer gets
//! nothing until the lease ends), what a claimer records is fenced by its token (a
//! claimer whose lease was taken over writes nothing), a fire is one row per (schedule,
//! fire time) that a buffered fire's start overwrites, pause keeps a schedule out of
//! claims, and a tenant's list holds only its own. Every "now" is the test's.

use chrono::{Duration, Utc};

use agentq_store::store::Store;
use agentq_types::schedule::{Advance, FireOutcome, FireRow, NewSchedule, Overlap};

use crate::common::contract_tests;

contract_tests!(contract_schedule_leases_fires_and_pause,);

fn schedule(id: &str, tenant: &str, next: chrono::DateTime<Utc>) -> NewSchedule {
    NewSchedule {
        id: id.into(),
        tenant: tenant.into(),
        cron: None,
        timezone: "UTC".into(),
        every_secs: Some(60),
        template: r#"{"prompt":"hi"}"#.into(),
        overlap: Overlap::BufferOne,
        catchup_window_secs: 60,
        description: None,
        paused: false,
        next_fire_at: next,
        created_at: next - Duration::seconds(60),
    }
}

fn fire(
    id: &str,
    t: chrono::DateTime<Utc>,
    outcome: FireOutcome,
    session: Option<&str>,
) -> FireRow {
    FireRow {
        schedule_id: id.into(),
        fire_time: t,
        outcome,
        session_id: session.map(str::to_string),
        cancelled_session_id: None,
        error: None,
        manual: false,
        recorded_at: t,
    }
}

async fn contract_schedule_leases_fires_and_pause(store: &dyn Store) {
    // Whole seconds: both stores keep microseconds.
    let now = chrono::DateTime::from_timestamp(Utc::now().timestamp(), 0).unwrap();
    let lease = now + Duration::seconds(60);
    store
        .create_schedule(&schedule("sch_a", "acme", now))
        .await
        .unwrap();
    store
        .create_schedule(&schedule("sch_b", "globex", now + Duration::hours(1)))
        .await
        .unwrap();
    let row = store.schedule("sch_a").await.unwrap().unwrap();
    assert_eq!(
        (row.overlap, row.every_secs, row.paused),
        (Overlap::BufferOne, Some(60), false)
    );
    assert_eq!(row.next_fire_at, now);
    let listed = store.list_schedules("acme", None, 10).await.unwrap();
    assert_eq!(
        listed.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["sch_a"]
    );
    assert!(
        store
            .list_schedules("acme", Some("sch_a"), 10)
            .await
            .unwrap()
            .is_empty()
    );

    // One claimer holds it; the not-yet-due one is not claimed.
    let got = store.claim_schedules(now, lease, "t1", 10).await.unwrap();
    assert_eq!(
        got.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["sch_a"]
    );
    assert!(
        store
            .claim_schedules(now, lease, "t2", 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .claim_schedule("sch_a", now, lease, "t2")
            .await
            .unwrap()
            .is_none()
    );
    // The lease ends: another claimer takes over; the first one's record is fenced off.
    let later = lease + Duration::seconds(1);
    let got = store
        .claim_schedules(later, later + Duration::seconds(60), "t2", 10)
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    let adv = Advance {
        next_fire_at: now + Duration::seconds(60),
        buffered_fire_at: Some(now),
        last_session_id: Some("s1".into()),
    };
    let buffered = fire("sch_a", now, FireOutcome::Buffered, None);
    assert!(
        !store
            .record_fires("sch_a", "t1", std::slice::from_ref(&buffered), &adv)
            .await
            .unwrap()
    );
    assert!(
        store
            .list_fires("sch_a", None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .record_fires("sch_a", "t2", &[buffered], &adv)
            .await
            .unwrap()
    );
    let row = store.schedule("sch_a").await.unwrap().unwrap();
    assert_eq!(
        (row.next_fire_at, row.buffered_fire_at, row.lease_token),
        (now + Duration::seconds(60), Some(now), None)
    );
    // A buffered fire waiting makes it due at once; its start overwrites its row.
    assert_eq!(
        store
            .claim_schedules(later, lease, "t3", 10)
            .await
            .unwrap()
            .len(),
        1
    );
    let started = fire("sch_a", now, FireOutcome::Started, Some("s2"));
    let adv = Advance {
        buffered_fire_at: None,
        last_session_id: Some("s2".into()),
        ..adv
    };
    assert!(
        store
            .record_fires("sch_a", "t3", std::slice::from_ref(&started), &adv)
            .await
            .unwrap()
    );
    assert_eq!(
        store.list_fires("sch_a", None, 10).await.unwrap(),
        vec![started]
    );
    assert!(
        store
            .list_fires("sch_a", Some(now), 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Paused: not claimed even when due; resumed with a new next time.
    assert!(store.set_schedule_paused("sch_a", true, now).await.unwrap());
    assert!(
        store
            .claim_schedules(later, lease, "t4", 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .set_schedule_paused("sch_a", false, now)
            .await
            .unwrap()
    );
    assert_eq!(
        store
            .claim_schedules(later, lease, "t4", 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(store.delete_schedule("sch_a").await.unwrap());
    assert!(store.schedule("sch_a").await.unwrap().is_none());
    assert!(
        store
            .list_fires("sch_a", None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(!store.delete_schedule("sch_a").await.unwrap());
}
