//! Signed webhooks (`/v1/webhooks`) against a real Postgres and Redis, delivered to a real
//! receiver (`webhook_receiver.py`) that verifies every signature with the Standard
//! Webhooks reference library (`standardwebhooks`, PyPI). The attacks first: another
//! tenant cannot read, rotate, redrive or delete an endpoint (404), a key without the
//! `webhooks` scope gets 403, private destinations are refused at creation (422 naming
//! `url`) and again at delivery, bad bodies name their field. Then deliveries: written by
//! the store with the change they announce, sent through a receiver answering 500, then
//! hanging, then 200 (every event delivered, verified, duplicates only with one id),
//! redirects not followed, slow and huge answers cut at the timeout and the cap, dead
//! letters and redrive, an endpoint disabled after failing continuously, secrets rotated
//! with an overlap. Time on the store's side is a [`ManualClock`]: no test waits for a
//! backoff.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use agentq_agent::schema::{Message, ToolCall};
use agentq_agent::spec::ExitReason;
use agentq_agent::state::Outcome;
use agentq_core::auth::Scope;
use agentq_core::{Claim, SessionStatus, Store};
use agentq_scheduler::SchedulerSettings;
use agentq_scheduler::webhooks::{Deliverer, ManualClock, WebhookSettings};
use agentq_testkit::shared_postgres;

use common::{Served, wait_until};

/// The receiver: a Python process and its directory.
struct Receiver {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl Receiver {
    async fn start() -> Receiver {
        let python = agentq_testkit::python::webhooks_python().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/webhook_receiver.py");
        let child = Command::new(python)
            .arg(&script)
            .arg(dir.path())
            .spawn()
            .unwrap();
        let port_file = dir.path().join("port");
        let port = wait_until("the receiver's port", Duration::from_secs(30), || {
            let f = port_file.clone();
            async move {
                std::fs::read_to_string(f)
                    .ok()
                    .and_then(|p| p.parse::<u16>().ok())
            }
        })
        .await;
        Receiver { child, dir, port }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The secrets each path verifies with.
    fn secrets(&self, by_path: &[(&str, Vec<String>)]) {
        let map: BTreeMap<&str, &Vec<String>> = by_path.iter().map(|(p, s)| (*p, s)).collect();
        let tmp = self.dir.path().join("secrets.tmp");
        std::fs::write(&tmp, serde_json::to_vec(&map).unwrap()).unwrap();
        std::fs::rename(tmp, self.dir.path().join("secrets.json")).unwrap();
    }

    /// Every request received so far.
    fn log(&self) -> Vec<Value> {
        let path: PathBuf = self.dir.path().join("log.jsonl");
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Env {
    base: String,
    db_url: String,
    store: Arc<dyn Store>,
    _served: Served,
    acme: String,
    globex: String,
    /// acme's key without the `webhooks` scope.
    acme_sessions_only: String,
    settings: WebhookSettings,
}

impl Env {
    /// A scheduler whose deliveries may reach `allowed` (the receiver's host and port).
    async fn start(allowed: Vec<String>) -> Env {
        let mut settings = SchedulerSettings::default();
        let section = agentq_core::config::WebhooksSection {
            allowed_hosts: allowed,
            timeout_secs: 2,
            max_response_bytes: 64 * 1024,
            retry_for_secs: 3_600,
            disable_after_secs: 86_400,
            ..Default::default()
        };
        settings.webhooks = WebhookSettings::new(
            &section,
            Some(agentq_core::config::Secret::new(
                "a-test-key-of-at-least-thirty-two-bytes",
            )),
        );
        let hooks = settings.webhooks.clone();
        let served = Served::start(settings).await;
        let all = [Scope::SessionsRead, Scope::SessionsWrite, Scope::Webhooks];
        let acme = served.key("acme", &all).await;
        let globex = served.key("globex", &all).await;
        let acme_sessions_only = served.acme.clone();
        Env {
            base: served.base.clone(),
            db_url: served.db_url.clone().unwrap(),
            store: served.store.clone(),
            _served: served,
            acme,
            globex,
            acme_sessions_only,
            settings: hooks,
        }
    }

    fn deliverer(&self, clock: Arc<ManualClock>) -> Deliverer {
        Deliverer::new(self.store.clone(), self.settings.clone(), clock)
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

    fn sql(&self, q: &str) -> String {
        shared_postgres().unwrap().psql(&self.db_url, q).unwrap()
    }

    /// A webhook of acme's to `url` for `events`; its id and secret.
    async fn webhook(&self, url: &str, events: &[&str]) -> (String, String) {
        let (status, v) = self
            .post(
                "/v1/webhooks",
                &self.acme,
                json!({"url": url, "events": events}),
            )
            .await;
        assert_eq!(status, 201, "{v}");
        (
            v["id"].as_str().unwrap().to_string(),
            v["secret"].as_str().unwrap().to_string(),
        )
    }

    /// A session of acme's.
    async fn session(&self) -> String {
        let (status, v) = self
            .post("/v1/sessions", &self.acme, json!({"prompt": "hi"}))
            .await;
        assert!(status == 201 || status == 202, "{status} {v}");
        v["id"].as_str().unwrap().to_string()
    }

    /// Run session `id` to the end with `reason`, as a worker's finishing checkpoint does.
    async fn finish(&self, id: &str, reason: ExitReason) {
        let Claim::Acquired {
            lease, mut state, ..
        } = self
            .store
            .claim(id, "w", Duration::from_secs(30), 10)
            .await
            .unwrap()
        else {
            panic!("claim {id}");
        };
        let from = state.messages.len();
        state.started_at = Some(chrono::Utc::now());
        state.push_assistant(Message::assistant("done"));
        state.outcome = Some(Outcome {
            reason,
            result: Some("ok".into()),
            error: (reason == ExitReason::Error).then(|| "it broke".to_string()),
        });
        self.store.checkpoint(&lease, &state, from).await.unwrap();
    }

    /// Suspend session `id` awaiting approval of one call, as a worker does.
    async fn await_approval(&self, id: &str) {
        let Claim::Acquired {
            lease,
            mut state,
            row,
        } = self
            .store
            .claim(id, "w", Duration::from_secs(30), 10)
            .await
            .unwrap()
        else {
            panic!("claim {id}");
        };
        let from = state.messages.len();
        let mut m = Message::assistant("");
        m.tool_calls = vec![ToolCall {
            id: "call_1".into(),
            name: "write_file".into(),
            arguments: json!({"path": "a.txt", "content": "x"}).into(),
        }];
        state.push_assistant(m);
        state.not_started = vec!["call_1".into()];
        self.store.checkpoint(&lease, &state, from).await.unwrap();
        self.store
            .suspend(&lease, SessionStatus::AwaitingApproval, row.wake_seq, None)
            .await
            .unwrap();
    }

    /// (event, state) of every delivery stored.
    fn deliveries(&self) -> Vec<(String, String)> {
        self.sql("SELECT event || ' ' || state FROM webhook_deliveries ORDER BY id")
            .lines()
            .map(|l| {
                let (e, s) = l.split_once(' ').unwrap();
                (e.to_string(), s.to_string())
            })
            .collect()
    }
}

fn assert_error(status: u16, v: &Value, want: u16, field: Option<&str>) {
    assert_eq!(status, want, "{v}");
    if let Some(f) = field {
        assert_eq!(v["error"]["field"], f, "{v}");
    }
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_tenants_missing_scopes_private_addresses_and_bad_bodies_are_refused() {
    let env = Env::start(vec!["127.0.0.1:9".into()]).await;
    let (id, secret) = env
        .webhook("http://127.0.0.1:9/in", &["session.completed"])
        .await;
    assert!(secret.starts_with("whsec_"), "{secret}");

    // The secret is shown once: never in a read or a listing.
    let (status, v) = env.get(&format!("/v1/webhooks/{id}"), &env.acme).await;
    assert_eq!(status, 200, "{v}");
    assert!(v.get("secret").is_none(), "{v}");
    assert_eq!(v["status"], "enabled");
    let (_, list) = env.get("/v1/webhooks", &env.acme).await;
    assert_eq!(list["webhooks"].as_array().unwrap().len(), 1);
    assert!(list["webhooks"][0].get("secret").is_none());

    // Another tenant: not found, whatever it tries; its listing is empty.
    for (method, path) in [
        (reqwest::Method::GET, format!("/v1/webhooks/{id}")),
        (reqwest::Method::DELETE, format!("/v1/webhooks/{id}")),
        (reqwest::Method::POST, format!("/v1/webhooks/{id}/rotate")),
        (reqwest::Method::POST, format!("/v1/webhooks/{id}/redrive")),
        (reqwest::Method::POST, format!("/v1/webhooks/{id}/enable")),
        (
            reqwest::Method::GET,
            format!("/v1/webhooks/{id}/deliveries"),
        ),
    ] {
        let body = (method == reqwest::Method::POST).then(|| json!({}));
        let (status, v) = env.call(method.clone(), &path, &env.globex, body).await;
        assert_error(status, &v, 404, None);
    }
    let (_, list) = env.get("/v1/webhooks", &env.globex).await;
    assert_eq!(list["webhooks"], json!([]));

    // A key without the scope: forbidden, even for its own tenant's endpoint.
    let (status, v) = env
        .get(&format!("/v1/webhooks/{id}"), &env.acme_sessions_only)
        .await;
    assert_error(status, &v, 403, None);
    let (status, v) = env
        .post(
            "/v1/webhooks",
            &env.acme_sessions_only,
            json!({"url": "http://127.0.0.1:9/", "events": ["session.failed"]}),
        )
        .await;
    assert_error(status, &v, 403, None);

    // Private, loopback, link-local destinations not allowed: refused naming `url`.
    for url in [
        "http://127.0.0.1:8080/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "http://192.168.1.1:9/",
        "http://[::1]:9/",
        "http://localhost:9/",
        "http://0.0.0.0:9/",
    ] {
        let (status, v) = env
            .post(
                "/v1/webhooks",
                &env.acme,
                json!({"url": url, "events": ["session.failed"]}),
            )
            .await;
        assert_error(status, &v, 422, Some("url"));
    }

    // Bad bodies name the field.
    let cases = [
        (
            json!({"url": "ftp://x.test/", "events": ["session.failed"]}),
            "url",
        ),
        (
            json!({"url": "https://u:p@x.test/", "events": ["session.failed"]}),
            "url",
        ),
        (json!({"url": 7, "events": ["session.failed"]}), "url"),
        (
            json!({"url": "http://127.0.0.1:9/", "events": []}),
            "events",
        ),
        (
            json!({"url": "http://127.0.0.1:9/", "events": ["session.nope"]}),
            "events[0]",
        ),
        (
            json!({"url": "http://127.0.0.1:9/", "events": ["batch.completed", "batch.completed"]}),
            "events[1]",
        ),
        (
            json!({"url": "http://127.0.0.1:9/", "events": ["session.failed"], "queue": "no way"}),
            "queue",
        ),
        (
            json!({"url": "http://127.0.0.1:9/", "events": ["session.failed"], "batch_id": "nope"}),
            "batch_id",
        ),
        (
            json!({"url": "http://127.0.0.1:9/", "events": ["session.failed"], "description": "x".repeat(2000)}),
            "description",
        ),
        (
            json!({"url": "http://127.0.0.1:9/", "events": ["session.failed"], "secret": "mine"}),
            "secret",
        ),
    ];
    for (body, field) in cases {
        let (status, v) = env.post("/v1/webhooks", &env.acme, body.clone()).await;
        assert!((400..500).contains(&status), "{body}: {status} {v}");
        assert_eq!(v["error"]["field"], field, "{body}: {v}");
    }
    let (status, v) = env
        .post(
            &format!("/v1/webhooks/{id}/rotate"),
            &env.acme,
            json!({"overlap_secs": 10_000_000}),
        )
        .await;
    assert_error(status, &v, 422, Some("overlap_secs"));
    let (status, v) = env
        .get(
            &format!("/v1/webhooks/{id}/deliveries?state=lost"),
            &env.acme,
        )
        .await;
    assert_error(status, &v, 422, Some("state"));
    let (status, v) = env
        .get(&format!("/v1/webhooks/{id}/deliveries?limit=0"), &env.acme)
        .await;
    assert_error(status, &v, 422, Some("limit"));

    // Nothing of the refused ones was stored; the owner deletes its endpoint.
    assert_eq!(env.sql("SELECT count(*) FROM webhook_endpoints"), "1");
    let (status, _) = env
        .call(
            reqwest::Method::DELETE,
            &format!("/v1/webhooks/{id}"),
            &env.acme,
            None,
        )
        .await;
    assert_eq!(status, 204);
    assert_eq!(env.sql("SELECT count(*) FROM webhook_endpoints"), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_event_arrives_signed_through_a_500_and_a_timeout_with_one_id_each() {
    let receiver = Receiver::start().await;
    let env = Env::start(vec![receiver.host()]).await;
    let (hook, secret) = env
        .webhook(
            &receiver.url("/script"),
            &["session.completed", "session.failed", "session.waiting"],
        )
        .await;
    receiver.secrets(&[("/script", vec![secret])]);

    // Changes of every kind, each by its own path: a worker's finish, a failure, a cancel
    // from the API, a suspension for approval. globex's session announces nothing.
    let done = env.session().await;
    env.finish(&done, ExitReason::Stop).await;
    let broke = env.session().await;
    env.finish(&broke, ExitReason::Error).await;
    let cancelled = env.session().await;
    let (status, v) = env
        .post(
            &format!("/v1/sessions/{cancelled}/cancel"),
            &env.acme,
            json!({}),
        )
        .await;
    assert!(status < 300, "{status} {v}");
    let held = env.session().await;
    env.await_approval(&held).await;
    let (_, other) = env
        .post("/v1/sessions", &env.globex, json!({"prompt": "hi"}))
        .await;
    env.finish(other["id"].as_str().unwrap(), ExitReason::Stop)
        .await;
    assert_eq!(env.deliveries().len(), 4, "{:?}", env.deliveries());

    // Attempt 1: 500. Attempt 2: the receiver hangs; the timeout ends it. Attempt 3: 200.
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let deliverer = env.deliverer(clock.clone());
    for _ in 0..3 {
        assert_eq!(deliverer.tick().await.unwrap(), 4);
        // Every retry is due within its backoff; nothing is due before.
        assert_eq!(deliverer.tick().await.unwrap(), 0);
        clock.advance(Duration::from_secs(3_000));
    }
    assert_eq!(deliverer.tick().await.unwrap(), 0);
    assert!(
        env.deliveries().iter().all(|(_, s)| s == "delivered"),
        "{:?}",
        env.deliveries()
    );

    let log = receiver.log();
    let mut ids_by_session: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut accepted = BTreeMap::new();
    for entry in &log {
        assert_eq!(
            entry["verified"],
            json!([true]),
            "every attempt is signed: {entry}"
        );
        // What is sent is what the document's `webhooks` describes.
        crate::openapi::assert_delivery_described(&entry["body"]);
        let session = entry["body"]["data"]["session_id"]
            .as_str()
            .unwrap()
            .to_string();
        ids_by_session
            .entry(session.clone())
            .or_default()
            .insert(entry["id"].as_str().unwrap().to_string());
        if entry["status"] == 200 {
            assert!(
                accepted.insert(session, entry["body"].clone()).is_none(),
                "{entry}"
            );
        }
    }
    // Each event: three attempts, one id.
    assert_eq!(log.len(), 12, "{log:?}");
    for (session, ids) in &ids_by_session {
        assert_eq!(ids.len(), 1, "{session}: {ids:?}");
    }
    assert_eq!(accepted.len(), 4);
    assert_eq!(accepted[&done]["type"], "session.completed");
    assert_eq!(accepted[&done]["data"]["finish_reason"], "stop");
    assert_eq!(accepted[&broke]["type"], "session.failed");
    assert_eq!(accepted[&broke]["data"]["status"], "failed");
    assert_eq!(accepted[&cancelled]["type"], "session.failed");
    assert_eq!(accepted[&cancelled]["data"]["status"], "cancelled");
    assert_eq!(accepted[&held]["type"], "session.waiting");
    // The held call as `GET /v1/sessions/{id}` shows it in `pending_approvals`.
    let (_, detail) = env.get(&format!("/v1/sessions/{held}"), &env.acme).await;
    assert_eq!(
        accepted[&held]["data"]["calls"], detail["pending_approvals"],
        "{detail}"
    );
    assert_eq!(
        accepted[&held]["data"]["calls"][0]["tool"], "write_file",
        "{}",
        accepted[&held]
    );
    assert_eq!(accepted[&held]["data"]["status"], "awaiting_approval");
    assert_eq!(accepted[&done]["data"]["batch_id"], Value::Null);

    // The owner sees it all.
    let (_, v) = env.get(&format!("/v1/webhooks/{hook}"), &env.acme).await;
    assert_eq!(
        v["counts"],
        json!({"pending": 0, "delivered": 4, "dead": 0}),
        "{v}"
    );
    assert!(v["failing_since"].is_null(), "{v}");
    assert!(v["last_failure"]["error"].as_str().is_some(), "{v}");
    let (_, page) = env
        .get(
            &format!("/v1/webhooks/{hook}/deliveries?limit=3"),
            &env.acme,
        )
        .await;
    assert_eq!(page["deliveries"].as_array().unwrap().len(), 3, "{page}");
    assert_eq!(page["deliveries"][0]["attempts"], 3, "{page}");
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, rest) = env
        .get(
            &format!("/v1/webhooks/{hook}/deliveries?cursor={cursor}"),
            &env.acme,
        )
        .await;
    assert_eq!(rest["deliveries"].as_array().unwrap().len(), 1, "{rest}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_slow_and_huge_answers_and_rebinding_do_not_get_through() {
    let receiver = Receiver::start().await;
    let env = Env::start(vec![receiver.host()]).await;
    let (redirect, _) = env
        .webhook(&receiver.url("/redirect"), &["session.completed"])
        .await;
    let (slow, _) = env
        .webhook(&receiver.url("/slow"), &["session.completed"])
        .await;
    let (huge, _) = env
        .webhook(&receiver.url("/huge"), &["session.completed"])
        .await;
    let s = env.session().await;
    env.finish(&s, ExitReason::Stop).await;

    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let deliverer = env.deliverer(clock.clone());
    let pass = tokio::time::timeout(Duration::from_secs(60), deliverer.tick()).await;
    assert_eq!(
        pass.expect("a slow answer holds no slot past the timeout")
            .unwrap(),
        3
    );

    let last = |id: &str| {
        env.sql(&format!(
            "SELECT state || ' ' || coalesce(last_status::text, '-') || ' ' || coalesce(last_error, '') \
             FROM webhook_deliveries WHERE endpoint_id = '{id}'"
        ))
    };
    // The redirect is not followed: the receiver saw no request at its target.
    assert!(
        last(&redirect).starts_with("pending 302 "),
        "{}",
        last(&redirect)
    );
    assert!(receiver.log().iter().all(|e| e["path"] != "/ok"));
    // The trickling answer ends at the timeout; the huge one is read up to the cap only.
    assert!(last(&slow).contains("no answer within"), "{}", last(&slow));
    assert!(last(&huge).starts_with("delivered 200"), "{}", last(&huge));

    // DNS rebinding: the endpoint's destination is checked again at delivery. Here the
    // operator stops allowing the receiver; the next attempt is refused, nothing is sent.
    let sent = receiver.log().len();
    let strict = Deliverer::new(
        env.store.clone(),
        WebhookSettings::new(&agentq_core::config::WebhooksSection::default(), None),
        clock.clone(),
    );
    clock.advance(Duration::from_secs(3_000));
    assert_eq!(strict.tick().await.unwrap(), 2);
    assert!(last(&redirect).contains("refused"), "{}", last(&redirect));
    assert_eq!(receiver.log().len(), sent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_redriven_and_a_failing_endpoint_is_disabled_and_enabled() {
    let receiver = Receiver::start().await;
    let env = Env::start(vec![receiver.host()]).await;
    let (hook, secret) = env
        .webhook(&receiver.url("/fail"), &["session.completed"])
        .await;
    receiver.secrets(&[("/ok", vec![secret])]);
    let s = env.session().await;
    env.finish(&s, ExitReason::Stop).await;

    // Retried for the retry window (an hour here), then dead.
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let deliverer = env.deliverer(clock.clone());
    let mut attempts = 0;
    while env.deliveries()[0].1 == "pending" {
        attempts += deliverer.tick().await.unwrap();
        clock.advance(Duration::from_secs(600));
        assert!(attempts < 50, "never dead-lettered");
    }
    assert_eq!(env.deliveries()[0].1, "dead");
    assert!(attempts >= 3, "{attempts}");
    let (_, v) = env.get(&format!("/v1/webhooks/{hook}"), &env.acme).await;
    assert_eq!(v["counts"]["dead"], 1, "{v}");
    assert_eq!(v["status"], "enabled", "{v}");
    assert!(v["failing_since"].is_string(), "{v}");
    let (_, dead) = env
        .get(
            &format!("/v1/webhooks/{hook}/deliveries?state=dead"),
            &env.acme,
        )
        .await;
    let dead_id = dead["deliveries"][0]["id"].as_str().unwrap().to_string();

    // Redrive to a receiver that now accepts: delivered, with the same id.
    env.sql(&format!(
        "UPDATE webhook_endpoints SET url = '{}' WHERE id = '{hook}'",
        receiver.url("/ok")
    ));
    let (status, v) = env
        .post(
            &format!("/v1/webhooks/{hook}/redrive"),
            &env.acme,
            json!({}),
        )
        .await;
    assert_eq!((status, v["requeued"].as_u64()), (200, Some(1)), "{v}");
    assert_eq!(deliverer.tick().await.unwrap(), 1);
    let ok: Vec<Value> = receiver
        .log()
        .into_iter()
        .filter(|e| e["path"] == "/ok")
        .collect();
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0]["id"], dead_id.as_str());
    assert_eq!(ok[0]["verified"], json!([true]));

    // Failing continuously past `disable_after` (a day here): disabled, with the reason;
    // its pending deliveries become dead letters; enabling starts again.
    env.sql(&format!(
        "UPDATE webhook_endpoints SET url = '{}' WHERE id = '{hook}'",
        receiver.url("/fail")
    ));
    let s2 = env.session().await;
    env.finish(&s2, ExitReason::Stop).await;
    deliverer.tick().await.unwrap();
    clock.advance(Duration::from_secs(90_000));
    let s3 = env.session().await;
    env.finish(&s3, ExitReason::Stop).await;
    deliverer.tick().await.unwrap();
    let (_, v) = env.get(&format!("/v1/webhooks/{hook}"), &env.acme).await;
    assert_eq!(v["status"], "disabled", "{v}");
    assert!(
        v["disabled_reason"].as_str().unwrap().contains("HTTP 500"),
        "{v}"
    );
    assert_eq!(v["counts"]["pending"], 0, "{v}");
    // Disabled: new events are not even written for it, and redrive says why not.
    let s4 = env.session().await;
    env.finish(&s4, ExitReason::Stop).await;
    let (_, after) = env.get(&format!("/v1/webhooks/{hook}"), &env.acme).await;
    assert_eq!(after["counts"], v["counts"], "{after}");
    let (status, v) = env
        .post(
            &format!("/v1/webhooks/{hook}/redrive"),
            &env.acme,
            json!({}),
        )
        .await;
    assert_error(status, &v, 409, None);
    let (status, v) = env
        .post(&format!("/v1/webhooks/{hook}/enable"), &env.acme, json!({}))
        .await;
    assert_eq!(
        (status, v["status"].as_str()),
        (200, Some("enabled")),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_secret_signs_beside_the_old_one_until_the_overlap_ends() {
    let receiver = Receiver::start().await;
    let env = Env::start(vec![receiver.host()]).await;
    let (hook, old) = env
        .webhook(&receiver.url("/ok"), &["session.completed"])
        .await;
    let (status, v) = env
        .post(
            &format!("/v1/webhooks/{hook}/rotate"),
            &env.acme,
            json!({"overlap_secs": 3600}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let new = v["secret"].as_str().unwrap().to_string();
    assert_ne!(new, old);
    assert!(v["previous_secret_expires_at"].is_string(), "{v}");
    receiver.secrets(&[("/ok", vec![old, new])]);

    // A minute ahead of the database, whose clock dates the events.
    let clock = Arc::new(ManualClock::new(
        chrono::Utc::now() + chrono::Duration::seconds(60),
    ));
    let deliverer = env.deliverer(clock.clone());
    let s = env.session().await;
    env.finish(&s, ExitReason::Stop).await;
    assert_eq!(deliverer.tick().await.unwrap(), 1);
    // Past the overlap only the new secret signs.
    clock.advance(Duration::from_secs(7_200));
    let s2 = env.session().await;
    env.finish(&s2, ExitReason::Stop).await;
    assert_eq!(deliverer.tick().await.unwrap(), 1);
    let log = receiver.log();
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!(log[0]["verified"], json!([true, true]), "{log:?}");
    assert_eq!(log[1]["verified"], json!([false, true]), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_announced_once_when_its_last_session_finishes() {
    let receiver = Receiver::start().await;
    let env = Env::start(vec![receiver.host()]).await;
    let (status, batch) = env
        .post(
            "/v1/batches",
            &env.acme,
            json!({"requests": [{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}]}),
        )
        .await;
    assert_eq!(status, 201, "{batch}");
    let batch_id = batch["id"].as_str().unwrap();
    let (status, v) = env
        .post(
            "/v1/webhooks",
            &env.acme,
            json!({"url": receiver.url("/ok"), "events": ["batch.completed"], "batch_id": batch_id}),
        )
        .await;
    assert_eq!(status, 201, "{v}");
    receiver.secrets(&[("/ok", vec![v["secret"].as_str().unwrap().to_string()])]);
    let ids: Vec<String> = env
        .sql(&format!(
            "SELECT id FROM sessions WHERE batch_id = '{batch_id}' ORDER BY id"
        ))
        .lines()
        .map(str::to_string)
        .collect();
    let clock = Arc::new(ManualClock::new(chrono::Utc::now()));
    let deliverer = env.deliverer(clock);
    for (i, id) in ids.iter().enumerate() {
        env.finish(id, ExitReason::Stop).await;
        deliverer.tick().await.unwrap();
        let announced = receiver.log().len();
        assert_eq!(announced, usize::from(i == ids.len() - 1), "after {i}");
    }
    // A later pass announces nothing again.
    deliverer.tick().await.unwrap();
    let log = receiver.log();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(log[0]["body"]["type"], "batch.completed");
    assert_eq!(log[0]["body"]["data"]["batch_id"], batch_id);
    assert_eq!(log[0]["verified"], json!([true]));
    crate::openapi::assert_delivery_described(&log[0]["body"]);
}
