//! Schedules (`/v1/schedules`) on both stores (Postgres with Redis, and the embedded
//! SQLite with the in-process queue). The attacks first: another tenant's schedule is a
//! 404 for every route and absent from its list; bad bodies are 422 naming the field (an
//! invalid cron, an unknown zone, both or neither of cron and every_secs, an absurd
//! interval, a bad overlap, a template error under `session.`). Then firing, driven by
//! [`Firer::tick`] with a [`ManualClock`] (no real waits): a fire happens once however
//! many claimers run; a claimer stopped between creating a fire's session and recording
//! the fire (as a SIGKILL there would) is taken over once its lease ends, without a
//! second session; the four overlap policies; the catch-up window after downtime; pause,
//! resume and trigger; a template the policy of fire time refuses is a `failed` fire.
//! Daylight-saving rules are held by pure tests of [`Timing`].

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use chrono::{DateTime, TimeZone, Utc};
use serde_json::{Value, json};

use agentq_scheduler::schedules::{Firer, Timing};
use agentq_scheduler::webhooks::ManualClock;
use agentq_scheduler::{Scheduler, SchedulerSettings};

use common::{Backend, Served};

/// The served scheduler, and the calls these tests make of it.
struct Env(Served);

impl std::ops::Deref for Env {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

impl Env {
    async fn start(backend: Backend) -> Env {
        Env(Served::on(backend, SchedulerSettings::default()).await)
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        common::read(req.send().await.unwrap()).await
    }

    async fn post(&self, path: &str, key: &str, body: Value) -> (u16, Value) {
        self.call(reqwest::Method::POST, path, key, Some(body))
            .await
    }

    async fn get(&self, path: &str, key: &str) -> (u16, Value) {
        self.call(reqwest::Method::GET, path, key, None).await
    }

    /// An acme schedule of `body`; its view.
    async fn schedule(&self, body: Value) -> Value {
        let (status, v) = self.post("/v1/schedules", &self.acme, body).await;
        assert_eq!(status, 201, "{v}");
        v
    }

    fn firer(&self, clock: &Arc<ManualClock>) -> Firer {
        Firer::new(self.state.clone(), clock.clone())
    }

    /// Schedule `id`'s fires, oldest first, as (outcome, session id).
    async fn fires(&self, id: &str) -> Vec<(String, Option<String>)> {
        let (status, v) = self
            .get(&format!("/v1/schedules/{id}/fires"), &self.acme)
            .await;
        assert_eq!(status, 200, "{v}");
        let mut out: Vec<_> = v["fires"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                (
                    f["outcome"].as_str().unwrap().to_string(),
                    f["session_id"].as_str().map(str::to_string),
                )
            })
            .collect();
        out.reverse();
        out
    }

    /// acme's sessions (ids).
    async fn sessions(&self) -> Vec<String> {
        let (status, v) = self.get("/v1/sessions?limit=500", &self.acme).await;
        assert_eq!(status, 200, "{v}");
        v["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap().to_string())
            .collect()
    }

    async fn status(&self, session: &str) -> String {
        let (_, v) = self
            .get(&format!("/v1/sessions/{session}"), &self.acme)
            .await;
        v["status"].as_str().unwrap().to_string()
    }

    async fn cancel(&self, session: &str) {
        let (status, v) = self
            .post(
                &format!("/v1/sessions/{session}/cancel"),
                &self.acme,
                json!({}),
            )
            .await;
        assert_eq!(status, 200, "{v}");
    }
}

fn every(secs: u64, overlap: &str) -> Value {
    json!({"every_secs": secs, "overlap": overlap, "session": {"prompt": "tick"}})
}

/// A clock at the moment a schedule was created (its first fire one interval later).
fn clock_at(view: &Value) -> Arc<ManualClock> {
    let created: DateTime<Utc> = view["created_at"].as_str().unwrap().parse().unwrap();
    Arc::new(ManualClock::new(created))
}

fn assert_field(status: u16, v: &Value, field: &str) {
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["field"], field, "{v}");
}

async fn bad_input_and_other_tenants_are_refused(backend: Backend) {
    let env = Env::start(backend).await;
    let session = json!({"prompt": "hi"});
    let cases = [
        (json!({"cron": "61 * * * *", "session": session}), "cron"),
        (json!({"cron": "not a cron", "session": session}), "cron"),
        (
            json!({"cron": "0 9 * * *", "timezone": "Mars/Olympus", "session": session}),
            "timezone",
        ),
        (json!({"session": session}), "cron"),
        (
            json!({"cron": "0 9 * * *", "every_secs": 60, "session": session}),
            "every_secs",
        ),
        (json!({"every_secs": 0, "session": session}), "every_secs"),
        (
            json!({"every_secs": 99_999_999_999u64, "session": session}),
            "every_secs",
        ),
        (
            json!({"every_secs": 60, "overlap": "sometimes", "session": session}),
            "overlap",
        ),
        (
            json!({"every_secs": 60, "catchup_window_secs": 10_000_000, "session": session}),
            "catchup_window_secs",
        ),
        (json!({"every_secs": 60}), "session"),
        (
            json!({"every_secs": 60, "session": {"prompt": 5}}),
            "session.prompt",
        ),
        (
            json!({"every_secs": 60, "session": {"prompt": "x", "model": 7}}),
            "session.model",
        ),
        (
            json!({"every_secs": 60, "session": {"prompt": "x", "max_iterations": 0}}),
            "session.max_iterations",
        ),
        (
            json!({"every_secs": 60, "session": {"prompt": "x", "idempotency_key": "k"}}),
            "session.idempotency_key",
        ),
        (
            json!({"every_secs": 60, "session": {"prompt": "x", "queue": "nope"}}),
            "session.queue",
        ),
        (
            json!({"every_secs": 60, "session": session, "colour": "red"}),
            "colour",
        ),
    ];
    for (body, field) in cases {
        let (status, v) = env.post("/v1/schedules", &env.acme, body.clone()).await;
        assert_field(status, &v, field);
    }

    other_tenants_cannot_reach_a_schedule(&env).await;
}

/// globex reaches none of acme's schedule, which stays as it was.
async fn other_tenants_cannot_reach_a_schedule(env: &Env) {
    let view = env.schedule(every(60, "skip")).await;
    let id = view["id"].as_str().unwrap();
    assert_eq!(view["timezone"], "UTC");
    assert_eq!(view["session"], json!({"prompt": "tick"}));
    // globex sees none of it, and can act on none of it.
    for path in [
        format!("/v1/schedules/{id}"),
        format!("/v1/schedules/{id}/fires"),
    ] {
        let (status, _) = env.get(&path, &env.globex).await;
        assert_eq!(status, 404, "{path}");
    }
    for action in ["pause", "resume", "trigger"] {
        let (status, _) = env
            .post(
                &format!("/v1/schedules/{id}/{action}"),
                &env.globex,
                json!({}),
            )
            .await;
        assert_eq!(status, 404, "{action}");
    }
    let (status, _) = env
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/schedules/{id}"),
            &env.globex,
            None,
        )
        .await;
    assert_eq!(status, 404);
    let (_, list) = env.get("/v1/schedules", &env.globex).await;
    assert_eq!(list["schedules"], json!([]));
    let (_, list) = env.get("/v1/schedules", &env.acme).await;
    assert_eq!(list["schedules"][0]["id"], id);
    assert!(env.sessions().await.is_empty(), "no fire from a refusal");
    // Still acme's, untouched.
    let (status, v) = env.get(&format!("/v1/schedules/{id}"), &env.acme).await;
    assert_eq!((status, v["paused"].as_bool()), (200, Some(false)));
    let (status, _) = env
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/schedules/{id}"),
            &env.acme,
            None,
        )
        .await;
    assert_eq!(status, 204);
}

async fn a_fire_happens_once_across_claimers(backend: Backend) {
    let env = Env::start(backend).await;
    let view = env.schedule(every(60, "allow_all")).await;
    let id = view["id"].as_str().unwrap().to_string();
    let clock = clock_at(&view);
    let (a, b) = (env.firer(&clock), env.firer(&clock));
    // Not due yet.
    assert_eq!(a.tick().await.unwrap(), 0);
    assert!(env.sessions().await.is_empty());
    clock.advance(Duration::from_secs(61));
    let (x, y) = tokio::join!(a.tick(), b.tick());
    assert_eq!(x.unwrap() + y.unwrap(), 1, "one claimer takes the schedule");
    assert_eq!(a.tick().await.unwrap(), 0, "handled: not due again");
    let fires = env.fires(&id).await;
    assert_eq!(fires.len(), 1, "{fires:?}");
    assert_eq!(fires[0].0, "started");
    assert_eq!(env.sessions().await, vec![fires[0].1.clone().unwrap()]);
    clock.advance(Duration::from_secs(60));
    b.tick().await.unwrap();
    assert_eq!(env.fires(&id).await.len(), 2);
    assert_eq!(env.sessions().await.len(), 2);
}

async fn a_claimer_killed_at_the_fire_is_taken_over_without_a_duplicate(backend: Backend) {
    let env = Env::start(backend).await;
    let view = env.schedule(every(60, "skip")).await;
    let id = view["id"].as_str().unwrap().to_string();
    let clock = clock_at(&view);
    let died = Arc::new(AtomicBool::new(false));
    let flag = died.clone();
    // Dies right after the session is created, before the fire is recorded.
    let doomed = env.firer(&clock).with_fault(Arc::new(move |_, _| {
        flag.store(true, Ordering::SeqCst);
        true
    }));
    clock.advance(Duration::from_secs(61));
    assert_eq!(doomed.tick().await.unwrap(), 1);
    assert!(died.load(Ordering::SeqCst));
    let made = env.sessions().await;
    assert_eq!(made.len(), 1, "the session was created");
    assert!(env.fires(&id).await.is_empty(), "but its fire not recorded");
    // Another scheduler: nothing while the dead one's lease holds, then the same fire.
    let other = env.firer(&clock);
    assert_eq!(other.tick().await.unwrap(), 0, "the lease holds");
    clock.advance(env.state.cfg.schedules.lease);
    assert_eq!(other.tick().await.unwrap(), 1);
    // The killed fire, recorded with the session it made; the time that came due during
    // the lease is skipped (`skip`: that session is still queued).
    assert_eq!(
        env.fires(&id).await,
        vec![
            ("started".to_string(), Some(made[0].clone())),
            ("skipped".to_string(), None),
        ]
    );
    assert_eq!(env.sessions().await, made, "no second session");
    // And the schedule goes on: the next time is the one after.
    let (_, v) = env.get(&format!("/v1/schedules/{id}"), &env.acme).await;
    let next: DateTime<Utc> = v["next_fire_at"].as_str().unwrap().parse().unwrap();
    let created: DateTime<Utc> = view["created_at"].as_str().unwrap().parse().unwrap();
    assert!(next > created + chrono::Duration::seconds(61), "{v}");
}

async fn overlap_policies(backend: Backend) {
    let env = Env::start(backend).await;
    for overlap in ["skip", "buffer_one", "cancel_other", "allow_all"] {
        let view = env.schedule(every(60, overlap)).await;
        let id = view["id"].as_str().unwrap().to_string();
        let clock = clock_at(&view);
        let firer = env.firer(&clock);
        for _ in 0..3 {
            clock.advance(Duration::from_secs(60));
            firer.tick().await.unwrap();
        }
        let fires = env.fires(&id).await;
        let outcomes: Vec<&str> = fires.iter().map(|f| f.0.as_str()).collect();
        let first = fires[0].1.clone().unwrap();
        match overlap {
            "skip" => assert_eq!(outcomes, ["started", "skipped", "skipped"], "{overlap}"),
            "buffer_one" => {
                assert_eq!(outcomes, ["started", "buffered", "skipped"], "{overlap}");
                // The running one ends: the buffered fire starts at the next pass.
                env.cancel(&first).await;
                clock.advance(Duration::from_secs(1));
                firer.tick().await.unwrap();
                let fires = env.fires(&id).await;
                assert_eq!(fires[1].0, "started", "{fires:?}");
                assert_ne!(fires[1].1.as_deref(), Some(first.as_str()));
                assert!(fires[1].1.is_some());
            }
            "cancel_other" => {
                assert_eq!(outcomes, ["started", "started", "started"], "{overlap}");
                assert_eq!(env.status(&first).await, "cancelled");
                assert_eq!(env.status(fires[1].1.as_ref().unwrap()).await, "cancelled");
                assert_eq!(env.status(fires[2].1.as_ref().unwrap()).await, "queued");
                let (_, v) = env
                    .get(&format!("/v1/schedules/{id}/fires"), &env.acme)
                    .await;
                assert_eq!(v["fires"][0]["cancelled_session_id"], json!(fires[1].1));
            }
            _ => {
                assert_eq!(outcomes, ["started", "started", "started"], "{overlap}");
                for f in &fires {
                    assert_eq!(env.status(f.1.as_ref().unwrap()).await, "queued");
                }
            }
        }
        env.call(
            reqwest::Method::DELETE,
            &format!("/v1/schedules/{id}"),
            &env.acme,
            None,
        )
        .await;
    }
}

async fn missed_fires_older_than_the_window_are_recorded_not_fired(backend: Backend) {
    let env = Env::start(backend).await;
    let mut body = every(60, "allow_all");
    body["catchup_window_secs"] = json!(150);
    let view = env.schedule(body).await;
    let id = view["id"].as_str().unwrap().to_string();
    let clock = clock_at(&view);
    // Ten fire times pass with no scheduler running.
    clock.advance(Duration::from_secs(600));
    env.firer(&clock).tick().await.unwrap();
    let outcomes: Vec<String> = env.fires(&id).await.into_iter().map(|f| f.0).collect();
    let mut want = vec!["missed"; 7];
    want.extend(["started"; 3]);
    assert_eq!(outcomes, want);
    assert_eq!(env.sessions().await.len(), 3);
}

async fn pause_resume_and_trigger(backend: Backend) {
    let env = Env::start(backend).await;
    let view = env.schedule(every(60, "allow_all")).await;
    let id = view["id"].as_str().unwrap().to_string();
    let clock = clock_at(&view);
    let (status, v) = env
        .post(&format!("/v1/schedules/{id}/pause"), &env.acme, json!({}))
        .await;
    assert_eq!((status, v["paused"].as_bool()), (200, Some(true)), "{v}");
    clock.advance(Duration::from_secs(600));
    assert_eq!(env.firer(&clock).tick().await.unwrap(), 0, "paused");
    // A trigger fires even while paused.
    let (status, fire) = env
        .post(&format!("/v1/schedules/{id}/trigger"), &env.acme, json!({}))
        .await;
    assert_eq!(status, 200, "{fire}");
    assert_eq!(
        (fire["outcome"].as_str(), fire["manual"].as_bool()),
        (Some("started"), Some(true))
    );
    assert_eq!(
        env.sessions().await,
        vec![fire["session_id"].as_str().unwrap().to_string()]
    );
    let (status, v) = env
        .post(&format!("/v1/schedules/{id}/resume"), &env.acme, json!({}))
        .await;
    assert_eq!((status, v["paused"].as_bool()), (200, Some(false)), "{v}");
    // Resumed from now on: the times passed while paused are not caught up.
    let next: DateTime<Utc> = v["next_fire_at"].as_str().unwrap().parse().unwrap();
    assert!(next > Utc::now(), "{v}");
}

async fn a_template_the_policy_now_refuses_is_a_failed_fire(backend: Backend) {
    let env = Env::start(backend).await;
    let mut body = every(60, "allow_all");
    body["session"]["model"] = json!("gpt-4o");
    let view = env.schedule(body).await;
    let id = view["id"].as_str().unwrap().to_string();
    let clock = clock_at(&view);
    // The operator's policy changed since: only other models.
    let stricter = agentq_core::config::PolicySection {
        models: vec!["claude-*".into()],
        ..Default::default()
    };
    let settings = SchedulerSettings {
        policy: Arc::new(agentq_core::policy::Policy::from_section(&stricter).unwrap()),
        ..SchedulerSettings::default()
    };
    let state = Scheduler::new(env.state.store.clone(), env.state.queue.clone(), settings);
    clock.advance(Duration::from_secs(61));
    Firer::new(state, clock.clone()).tick().await.unwrap();
    let (_, v) = env
        .get(&format!("/v1/schedules/{id}/fires"), &env.acme)
        .await;
    assert_eq!(v["fires"][0]["outcome"], "failed", "{v}");
    assert!(v["fires"][0]["session_id"].is_null(), "{v}");
    assert!(
        v["fires"][0]["error"]
            .as_str()
            .unwrap()
            .starts_with("model"),
        "{v}"
    );
    assert!(env.sessions().await.is_empty());
}

macro_rules! on_both {
    ($($case:ident),* $(,)?) => {
        mod pg {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Backend::Postgres).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    super::$case(super::Backend::Sqlite).await;
                }
            )*
        }
    };
}

on_both!(
    bad_input_and_other_tenants_are_refused,
    a_fire_happens_once_across_claimers,
    a_claimer_killed_at_the_fire_is_taken_over_without_a_duplicate,
    overlap_policies,
    missed_fires_older_than_the_window_are_recorded_not_fired,
    pause_resume_and_trigger,
    a_template_the_policy_now_refuses_is_a_failed_fire,
);

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, 0).unwrap()
}

/// The fire times of `t` strictly after `from`, `n` of them.
fn times(t: &Timing, from: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    let mut at = from;
    for _ in 0..n {
        at = t.next_after(at).unwrap();
        out.push(at);
    }
    out
}

#[test]
fn a_skipped_local_time_fires_once_after_the_gap() {
    // Berlin springs forward on 2026-03-29: 02:00 CET becomes 03:00 CEST; 02:30 is
    // never on a clock that day.
    let t = Timing::parse(Some("30 2 * * *"), Some("Europe/Berlin"), None).unwrap();
    assert_eq!(
        times(&t, utc(2026, 3, 27, 12, 0), 3),
        vec![
            utc(2026, 3, 28, 1, 30), // 02:30 CET
            utc(2026, 3, 29, 1, 0),  // 03:00 CEST: the first instant after the gap
            utc(2026, 3, 30, 0, 30), // 02:30 CEST
        ]
    );
}

#[test]
fn a_repeated_local_time_fires_once() {
    // Berlin falls back on 2026-10-25: 03:00 CEST becomes 02:00 CET; 02:30 happens twice.
    let t = Timing::parse(Some("30 2 * * *"), Some("Europe/Berlin"), None).unwrap();
    assert_eq!(
        times(&t, utc(2026, 10, 24, 12, 0), 2),
        vec![
            utc(2026, 10, 25, 0, 30), // 02:30 CEST, the first one
            utc(2026, 10, 26, 1, 30), // 02:30 CET the next day
        ]
    );
}

#[test]
fn a_zone_is_read_in_its_own_time() {
    let t = Timing::parse(Some("0 9 * * 1-5"), Some("America/New_York"), None).unwrap();
    // Friday 2026-01-09 09:00 EST = 14:00 UTC, then Monday.
    assert_eq!(
        times(&t, utc(2026, 1, 9, 0, 0), 2),
        vec![utc(2026, 1, 9, 14, 0), utc(2026, 1, 12, 14, 0)]
    );
    let every = Timing::parse(None, None, Some(90)).unwrap();
    assert_eq!(
        times(&every, utc(2026, 1, 1, 0, 0), 2),
        vec![
            utc(2026, 1, 1, 0, 0) + chrono::Duration::seconds(90),
            utc(2026, 1, 1, 0, 3),
        ]
    );
}
