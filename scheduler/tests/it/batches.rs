//! Batches as objects (`/v1/batches`) against a real Postgres and Redis. The attacks
//! first: another tenant's batch is invisible and cannot be cancelled; garbage uploads,
//! a line too long, too many items, a bad `custom_id` (not a string, too long, repeated),
//! an idempotency key in use and bad query options are refused naming the field or the
//! line, and write nothing. Then a batch's life: created from JSON Lines or a JSON body,
//! its sessions enqueued (or held under a cap), counted as they finish, its results read
//! a page at a time by cursor up to the first unfinished item, cancelled, listed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use agentq_agent::schema::{Message, Usage};
use agentq_agent::spec::ExitReason;
use agentq_agent::state::Outcome;
use agentq_core::auth::{self, Scope};
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{Claim, KeyStore, LeaseStore, QueueHealth};
use agentq_scheduler::{Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, shared_postgres};

use common::{read, wait_until};

const ADMIN_KEY: &str = "batches-test-admin-key";
const NDJSON: &str = "application/x-ndjson";

struct Env {
    base: String,
    db_url: String,
    store: Arc<PgStore>,
    queue: Arc<RedisQueue>,
    state: Scheduler,
    _redis: RedisServer,
    acme: String,
    globex: String,
}

/// A response: status, headers, body (JSON, else the text as a JSON string).
struct Answer {
    status: u16,
    headers: reqwest::header::HeaderMap,
    text: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or(Value::String(self.text.clone()))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }

    /// The JSON Lines of a results page.
    fn lines(&self) -> Vec<Value> {
        self.text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

impl Env {
    async fn start() -> Env {
        Self::start_with(|_| {}).await
    }

    async fn start_with(tune: impl FnOnce(&mut SchedulerSettings)) -> Env {
        let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&db_url, 8).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let redis = RedisServer::start().unwrap();
        let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
        let mut settings = SchedulerSettings::default();
        settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
        tune(&mut settings);
        let state = Scheduler::new(store.clone(), queue.clone(), settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let app = router(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let key = |tenant: &str| {
            let (new, key) = auth::generate(
                tenant,
                vec![Scope::SessionsRead, Scope::SessionsWrite],
                None,
                None,
            )
            .unwrap();
            (new, key)
        };
        let (a, acme) = key("acme");
        let (g, globex) = key("globex");
        store.create_key(&a).await.unwrap();
        store.create_key(&g).await.unwrap();
        Env {
            base: format!("http://{addr}"),
            db_url,
            store,
            queue,
            state,
            _redis: redis,
            acme,
            globex,
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Answer {
        let r = req.send().await.unwrap();
        Answer {
            status: r.status().as_u16(),
            headers: r.headers().clone(),
            text: r.text().await.unwrap(),
        }
    }

    fn http(&self, method: reqwest::Method, path: &str, key: &str) -> reqwest::RequestBuilder {
        reqwest::Client::new()
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key)
    }

    /// An upload of `lines` (joined by newlines) as `key`.
    async fn upload(&self, query: &str, key: &str, lines: &[String]) -> Answer {
        self.upload_raw(query, key, lines.join("\n").into_bytes())
            .await
    }

    async fn upload_raw(&self, query: &str, key: &str, body: Vec<u8>) -> Answer {
        let path = format!("/v1/batches{query}");
        self.send(
            self.http(reqwest::Method::POST, &path, key)
                .header("content-type", NDJSON)
                .body(body),
        )
        .await
    }

    async fn post_json(&self, path: &str, key: &str, body: &Value) -> Answer {
        self.send(self.http(reqwest::Method::POST, path, key).json(body))
            .await
    }

    async fn get(&self, path: &str, key: &str) -> Answer {
        self.send(self.http(reqwest::Method::GET, path, key)).await
    }

    fn sql(&self, q: &str) -> String {
        shared_postgres().unwrap().psql(&self.db_url, q).unwrap()
    }

    /// (batches, sessions) stored.
    fn written(&self) -> (u64, u64) {
        (
            self.sql("SELECT count(*) FROM batches").parse().unwrap(),
            self.sql("SELECT count(*) FROM sessions").parse().unwrap(),
        )
    }

    /// The sessions of batch `id`, in id order.
    fn session_ids(&self, id: &str) -> Vec<String> {
        let out = self.sql(&format!(
            "SELECT id FROM sessions WHERE batch_id = '{id}' ORDER BY id"
        ));
        out.lines().map(str::to_string).collect()
    }

    /// Run session `id` to the end with `reason`, having used `input` tokens, as a worker
    /// does.
    async fn finish(&self, id: &str, input: u64, reason: ExitReason) {
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
        let mut m = Message::assistant("done");
        m.usage = Some(Usage {
            input_tokens: input,
            output_tokens: 1,
            ..Default::default()
        });
        state.push_assistant(m);
        state.outcome = Some(Outcome {
            reason,
            result: Some(format!("result of {id}")),
            error: (reason == ExitReason::Error).then(|| "it broke".to_string()),
        });
        self.store.checkpoint(&lease, &state, from).await.unwrap();
    }

    /// Claim session `id` and commit a first step: it runs.
    async fn start_running(&self, id: &str) {
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
        state.push_assistant(Message::assistant("thinking"));
        self.store.checkpoint(&lease, &state, from).await.unwrap();
    }
}

fn item(prompt: &str, custom: Option<&str>) -> String {
    let mut v = json!({"prompt": prompt});
    if let Some(c) = custom {
        v["custom_id"] = json!(c);
    }
    v.to_string()
}

/// `n` items named `c0`…
fn items(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| item(&format!("task {i}"), Some(&format!("c{i}"))))
        .collect()
}

fn assert_error(a: &Answer, status: u16, code: &str, field: Option<&str>) {
    let v = a.json();
    assert_eq!(a.status, status, "{v}");
    assert_eq!(v["error"]["code"], code, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    match field {
        Some(f) => assert_eq!(v["error"]["field"], f, "{v}"),
        None => assert!(v["error"]["field"].is_null(), "{v}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenants_batch_is_invisible_and_cannot_be_cancelled() {
    let env = Env::start().await;
    let made = env.upload("", &env.acme, &items(3)).await;
    assert_eq!(made.status, 201, "{}", made.text);
    let id = made.json()["id"].as_str().unwrap().to_string();

    // Every route of the batch answers globex as if it did not exist.
    let missing = env.get(&format!("/v1/batches/{id}"), &env.globex).await;
    assert_error(&missing, 404, "not_found", None);
    let unknown = env.get("/v1/batches/no-such-batch", &env.globex).await;
    assert_eq!(
        (
            missing.status,
            missing.json()["error"]["message"]
                .as_str()
                .map(|m| m.replace(&id, "X"))
        ),
        (
            unknown.status,
            unknown.json()["error"]["message"]
                .as_str()
                .map(|m| m.replace("no-such-batch", "X"))
        ),
        "the same answer as a batch that does not exist"
    );
    let results = env
        .get(&format!("/v1/batches/{id}/results"), &env.globex)
        .await;
    assert_error(&results, 404, "not_found", None);
    let cancel = env
        .post_json(&format!("/v1/batches/{id}/cancel"), &env.globex, &json!({}))
        .await;
    assert_error(&cancel, 404, "not_found", None);
    assert_eq!(
        env.sql(&format!(
            "SELECT count(*) FROM sessions WHERE batch_id = '{id}' AND status = 'queued'"
        )),
        "3",
        "nothing was cancelled"
    );
    assert_eq!(
        env.sql(&format!(
            "SELECT cancelled_at IS NULL FROM batches WHERE id = '{id}'"
        )),
        "t"
    );
    let theirs = env.get("/v1/batches", &env.globex).await;
    assert_eq!(theirs.json()["batches"], json!([]));
    // Nor can globex join it through the old route.
    let join = env
        .post_json(
            &format!("/v1/sessions/batch?batch_id={id}"),
            &env.globex,
            &json!([{"prompt": "sneak in"}]),
        )
        .await;
    assert_error(&join, 422, "invalid_field", Some("batch_id"));
    assert_eq!(env.session_ids(&id).len(), 3);

    // Its owner and the operator see it.
    assert_eq!(
        env.get(&format!("/v1/batches/{id}"), &env.acme)
            .await
            .status,
        200
    );
    let all = env.get("/v1/batches", ADMIN_KEY).await.json();
    assert_eq!(all["batches"][0]["id"], id.as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_is_refused_naming_the_line_or_field_and_writes_nothing() {
    let env = Env::start().await;
    // An existing session whose idempotency key a line reuses.
    let used = env
        .post_json(
            "/v1/sessions",
            &env.acme,
            &json!({"prompt": "x", "idempotency_key": "k1"}),
        )
        .await;
    assert_eq!(used.status, 201);
    let before = env.written();
    let long_id = "x".repeat(257);
    let cases: Vec<(Vec<String>, u16, &str, Option<&str>)> = vec![
        (
            vec![item("a", None), "{not json".into()],
            400,
            "invalid_json",
            Some("line 2"),
        ),
        (vec!["[1, 2]".into()], 422, "invalid_body", Some("line 1")),
        (
            vec!["\"just a string\"".into()],
            422,
            "invalid_body",
            Some("line 1"),
        ),
        (
            vec![
                item("a", None),
                String::new(),
                r#"{"prompt": "a\u0000b"}"#.into(),
            ],
            422,
            "invalid_field",
            Some("line 3.prompt"),
        ),
        (
            vec![r#"{"prompt": "a", "prompt": "b"}"#.into()],
            422,
            "invalid_field",
            Some("line 1.prompt"),
        ),
        (
            vec![item("a", None), r#"{"promt": "typo"}"#.into()],
            422,
            "unknown_field",
            Some("line 2.promt"),
        ),
        (
            vec![r#"{"prompt": "a", "metadata": {"api_key": "sk-1"}}"#.into()],
            422,
            "credential_not_allowed",
            Some("line 1.metadata.api_key"),
        ),
        (
            vec![r#"{"prompt": "a", "queue": "nowhere"}"#.into()],
            422,
            "invalid_field",
            Some("line 1.queue"),
        ),
        (
            vec![r#"{"prompt": "a", "mode": "sideways"}"#.into()],
            422,
            "invalid_field",
            Some("line 1.mode"),
        ),
        (
            vec![
                item("a", Some("ok")),
                r#"{"prompt": "a", "custom_id": 7}"#.into(),
            ],
            422,
            "invalid_field",
            Some("line 2.custom_id"),
        ),
        (
            vec![json!({"prompt": "a", "custom_id": long_id}).to_string()],
            422,
            "invalid_field",
            Some("line 1.custom_id"),
        ),
        (
            vec![r#"{"prompt": "a", "custom_id": {"nested": 1}}"#.into()],
            422,
            "invalid_field",
            Some("line 1.custom_id"),
        ),
        // Found by the store, after every line was checked: still nothing written.
        (
            vec![
                item("a", Some("dup")),
                item("b", Some("other")),
                String::new(),
                item("c", Some("dup")),
            ],
            422,
            "invalid_field",
            Some("line 4.custom_id"),
        ),
        (
            vec![
                item("a", None),
                r#"{"prompt": "b", "idempotency_key": "k1"}"#.into(),
            ],
            409,
            "conflict",
            Some("line 2.idempotency_key"),
        ),
        (vec![String::new(), "  ".into()], 422, "invalid_batch", None),
    ];
    for (lines, status, code, field) in cases {
        let a = env.upload("", &env.acme, &lines).await;
        assert_error(&a, status, code, field);
        assert_eq!(env.written(), before, "{lines:?} wrote something");
    }
    // Not JSON Lines nor JSON.
    let a = env
        .send(
            env.http(reqwest::Method::POST, "/v1/batches", &env.acme)
                .header("content-type", "text/plain")
                .body(item("a", None)),
        )
        .await;
    assert_eq!(a.status, 415, "{}", a.text);
    let a = env.upload_raw("", &env.acme, vec![0xff, 0xfe, b'\n']).await;
    assert_error(&a, 400, "invalid_json", Some("line 1"));

    // A JSON body: its fields, its items named by index.
    let body_cases: Vec<(Value, u16, &str, Option<&str>)> = vec![
        (
            json!({"requests": [{"prompt": "a"}], "extra": 1}),
            422,
            "unknown_field",
            Some("extra"),
        ),
        (
            json!({"max_running": 2}),
            422,
            "invalid_field",
            Some("requests"),
        ),
        (
            json!({"requests": {"prompt": "a"}}),
            422,
            "invalid_batch",
            Some("requests"),
        ),
        (
            json!({"requests": []}),
            422,
            "invalid_batch",
            Some("requests"),
        ),
        (
            json!({"requests": [{"prompt": "a"}], "max_running": 0}),
            422,
            "invalid_field",
            Some("max_running"),
        ),
        (
            json!({"requests": [{"prompt": "a"}], "metadata": "x"}),
            422,
            "invalid_field",
            Some("metadata"),
        ),
        (
            json!({"requests": [{"prompt": "a"}, {"prompt": "b", "mode": "x"}]}),
            422,
            "invalid_field",
            Some("requests[1].mode"),
        ),
        (
            json!({"requests": [{"prompt": "a", "custom_id": false}]}),
            422,
            "invalid_field",
            Some("requests[0].custom_id"),
        ),
        (
            json!({"requests": [{"prompt": "a", "custom_id": "d"}, {"prompt": "b", "custom_id": "d"}]}),
            422,
            "invalid_field",
            Some("requests[1].custom_id"),
        ),
        (json!([{"prompt": "a"}]), 422, "invalid_body", None),
    ];
    for (body, status, code, field) in body_cases {
        let a = env.post_json("/v1/batches", &env.acme, &body).await;
        assert_error(&a, status, code, field);
        assert_eq!(env.written(), before, "{body} wrote something");
    }
    let too_many: Vec<Value> = (0..10_001)
        .map(|i| json!({"prompt": format!("p{i}")}))
        .collect();
    let a = env
        .post_json("/v1/batches", &env.acme, &json!({"requests": too_many}))
        .await;
    assert_error(&a, 422, "invalid_batch", Some("requests"));
    assert_eq!(env.written(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_line_too_many_items_and_bad_options_are_refused_by_name() {
    let env = Env::start_with(|s| {
        s.max_batch_items = 3;
        s.max_prompt_bytes = 1_000;
    })
    .await;
    let before = env.written();
    // The fourth item, wherever blank lines put it.
    let mut lines = items(3);
    lines.insert(1, String::new());
    lines.push(item("one too many", None));
    let a = env.upload("", &env.acme, &lines).await;
    assert_error(&a, 413, "too_large", Some("line 5"));
    // A prompt past its bound, as in one session's body.
    let a = env
        .upload("", &env.acme, &[item(&"p".repeat(1_001), None)])
        .await;
    assert_error(&a, 413, "too_large", Some("line 1.prompt"));
    // A line longer than a session's body may be, refused before it ends. What follows
    // the bound stays within what the server drains after refusing, so it has read the
    // whole body when it answers and the answer always reaches the client (past the
    // drain the server closes mid-upload and the client's write may fail first).
    let past_bound = agentq_scheduler::DRAIN_BYTES / 4;
    let mut body = format!("{}\n", item("fine", None)).into_bytes();
    body.extend(std::iter::repeat_n(
        b' ',
        env.state.single_body_limit() + past_bound,
    ));
    let a = env.upload_raw("", &env.acme, body).await;
    assert_error(&a, 413, "too_large", Some("line 2"));
    assert_eq!(env.written(), before);

    // Options: in the query of an upload, each named; none in a JSON body's query.
    for (query, field, code) in [
        ("?max_running=0", "max_running", "invalid_field"),
        ("?max_running=lots", "max_running", "invalid_field"),
        ("?metadata=%7Bnot", "metadata", "invalid_field"),
        ("?metadata=%5B1%5D", "metadata", "invalid_field"),
        (
            "?metadata=%7B%22token%22%3A1%7D",
            "metadata.token",
            "credential_not_allowed",
        ),
        ("?batch_id=b1", "batch_id", "unknown_field"),
        (
            "?max_running=1&max_running=2",
            "max_running",
            "invalid_field",
        ),
    ] {
        let a = env.upload(query, &env.acme, &items(1)).await;
        assert_error(&a, 422, code, Some(field));
    }
    let a = env
        .post_json(
            "/v1/batches?max_running=2",
            &env.acme,
            &json!({"requests": [{"prompt": "a"}]}),
        )
        .await;
    assert_error(&a, 422, "unknown_field", Some("max_running"));
    assert_eq!(env.written(), before);

    let made = env.upload("", &env.acme, &items(1)).await;
    let id = made.json()["id"].as_str().unwrap().to_string();
    for (path, field) in [
        (format!("/v1/batches/{id}/results?limit=0"), "limit"),
        (format!("/v1/batches/{id}/results?limit=10001"), "limit"),
        (
            format!("/v1/batches/{id}/results?after={}", "a".repeat(200)),
            "after",
        ),
        (format!("/v1/batches/{id}/results?cursor=x"), "cursor"),
        ("/v1/batches?limit=101".to_string(), "limit"),
        ("/v1/batches?after=x".to_string(), "after"),
    ] {
        let a = env.get(&path, &env.acme).await;
        assert_eq!(a.status, 422, "{path}: {}", a.text);
        assert_eq!(a.json()["error"]["field"], field, "{path}");
    }
    let a = env.get("/v1/batches/a%00b", &env.acme).await;
    assert_error(&a, 422, "invalid_field", Some("id"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_is_counted_read_by_cursor_and_cancelled() {
    let env = Env::start().await;
    let made = env
        .upload(
            "?max_running=4&metadata=%7B%22team%22%3A%22support%22%7D",
            &env.acme,
            &items(5),
        )
        .await;
    assert_eq!(made.status, 201, "{}", made.text);
    let v = made.json();
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(v["status"], "in_progress");
    assert_eq!(
        (v["total"].clone(), v["counts"]["queued"].clone()),
        (json!(5), json!(5))
    );
    assert_eq!(v["metadata"], json!({"team": "support"}));
    assert_eq!(v["max_running"], 4);
    // Its sessions carry the batch and its cap, with their custom ids, enqueued (no
    // dispatcher runs here, so none is held).
    let ids = env.session_ids(&id);
    assert_eq!(ids.len(), 5);
    assert_eq!(
        env.sql(&format!(
            "SELECT count(*) FROM sessions WHERE batch_id = '{id}' AND batch_max_running = 4 \
             AND tenant = 'acme' AND custom_id LIKE 'c%' AND enqueued_at IS NOT NULL"
        )),
        "5"
    );
    assert_eq!(env.queue.stats("default").await.unwrap().length, 5);
    let custom_of = |sid: &str| {
        env.sql(&format!(
            "SELECT custom_id FROM sessions WHERE id = '{sid}'"
        ))
    };

    // Two finish (the first two in id order), one runs.
    env.finish(&ids[0], 100, ExitReason::Stop).await;
    env.finish(&ids[1], 50, ExitReason::Error).await;
    env.start_running(&ids[2]).await;
    let v = env
        .get(&format!("/v1/batches/{id}"), &env.acme)
        .await
        .json();
    assert_eq!(v["status"], "in_progress");
    assert_eq!(v["counts"]["completed"], 1);
    assert_eq!(v["counts"]["failed"], 1);
    assert_eq!(v["counts"]["running"], 1);
    assert_eq!(v["counts"]["queued"], 2);
    assert_eq!(v["finish_reasons"], json!({"stop": 1, "error": 1}));
    assert_eq!(v["usage"]["input_tokens"], 150);
    assert!(v["started_at"].is_string() && v["finished_at"].is_null());
    assert!(v["eta_secs"].is_u64(), "a rate once some finished: {v}");

    // Results in id order, a page at a time, up to the first unfinished item.
    let page = env
        .get(&format!("/v1/batches/{id}/results?limit=1"), &env.acme)
        .await;
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some(NDJSON));
    assert_eq!(page.header("agentq-results"), Some("more"));
    assert_eq!(page.header("agentq-next"), Some(ids[0].as_str()));
    let lines = page.lines();
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["id"], ids[0].as_str());
    assert_eq!(lines[0]["custom_id"], custom_of(&ids[0]).as_str());
    assert_eq!(lines[0]["status"], "completed");
    assert_eq!(lines[0]["result"], format!("result of {}", ids[0]));
    assert_eq!(lines[0]["usage"]["input_tokens"], 100);
    let page = env
        .get(
            &format!("/v1/batches/{id}/results?after={}", ids[0]),
            &env.acme,
        )
        .await;
    assert_eq!(page.header("agentq-results"), Some("waiting"));
    assert_eq!(page.header("agentq-next"), Some(ids[1].as_str()));
    let lines = page.lines();
    assert_eq!(lines.len(), 1);
    assert_eq!(
        (lines[0]["status"].clone(), lines[0]["error"].clone()),
        (json!("failed"), json!("it broke"))
    );
    assert_eq!(lines[0]["finish_reason"], "error");
    let page = env
        .get(
            &format!("/v1/batches/{id}/results?after={}", ids[1]),
            &env.acme,
        )
        .await;
    assert_eq!(
        (page.text.as_str(), page.header("agentq-results")),
        ("", Some("waiting"))
    );
    assert_eq!(
        page.header("agentq-next"),
        Some(ids[1].as_str()),
        "the cursor stays"
    );

    // Cancel: the queued ones at once, the running one asked to stop (202).
    let cancelled = env
        .post_json(&format!("/v1/batches/{id}/cancel"), &env.acme, &json!({}))
        .await;
    assert_eq!(cancelled.status, 202, "{}", cancelled.text);
    let v = cancelled.json();
    assert_eq!(v["status"], "cancelling");
    assert_eq!(v["counts"]["cancelled"], 2);
    assert!(v["cancelled_at"].is_string());
    assert_eq!(
        env.sql(&format!(
            "SELECT cancel_requested FROM sessions WHERE id = '{}'",
            ids[2]
        )),
        "t"
    );
    // Its worker stops it; the batch is then cancelled, every result there.
    let Claim::Acquired {
        lease, mut state, ..
    } = env
        .store
        .claim(&ids[2], "w", Duration::from_secs(30), 10)
        .await
        .unwrap()
    else {
        panic!("claim");
    };
    let from = state.messages.len();
    state.outcome = Some(Outcome {
        reason: ExitReason::Interrupted,
        result: None,
        error: None,
    });
    env.store.checkpoint(&lease, &state, from).await.unwrap();
    let v = env
        .get(&format!("/v1/batches/{id}"), &env.acme)
        .await
        .json();
    assert_eq!(v["status"], "cancelled");
    assert!(v["finished_at"].is_string() && v["eta_secs"].is_null());
    assert_eq!(v["finish_reasons"]["interrupted"], 3);
    let page = env
        .get(
            &format!("/v1/batches/{id}/results?after={}", ids[1]),
            &env.acme,
        )
        .await;
    assert_eq!(page.header("agentq-results"), Some("complete"));
    assert_eq!(page.header("agentq-next"), None);
    let rest: Vec<String> = page
        .lines()
        .iter()
        .map(|l| l["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(rest, ids[2..]);
    // Cancelling again changes nothing.
    let again = env
        .post_json(&format!("/v1/batches/{id}/cancel"), &env.acme, &json!({}))
        .await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["cancelled_at"], v["cancelled_at"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_body_makes_the_same_object_and_batches_are_listed_newest_first() {
    let env = Env::start().await;
    let mut made = Vec::new();
    for i in 0..3 {
        let a = env
            .post_json(
                "/v1/batches",
                &env.acme,
                &json!({"requests": [
                    {"prompt": format!("a{i}"), "custom_id": "first", "priority": 7},
                    {"prompt": format!("b{i}")}],
                    "metadata": {"run": i}}),
            )
            .await;
        assert_eq!(a.status, 201, "{}", a.text);
        assert_eq!(a.json()["total"], 2);
        made.push(a.json()["id"].as_str().unwrap().to_string());
    }
    let first = &made[0];
    assert_eq!(
        env.sql(&format!(
            "SELECT custom_id, priority FROM sessions WHERE batch_id = '{first}' \
             AND custom_id IS NOT NULL"
        )),
        "first|7"
    );
    made.reverse();
    let page = env.get("/v1/batches?limit=2", &env.acme).await.json();
    let listed: Vec<&str> = page["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed, [made[0].as_str(), made[1].as_str()]);
    assert_eq!(page["batches"][0]["metadata"], json!({"run": 2}));
    assert_eq!(page["batches"][0]["counts"]["queued"], 2);
    let cursor = page["next_cursor"].as_str().unwrap();
    let rest = env
        .get(&format!("/v1/batches?cursor={cursor}"), &env.acme)
        .await
        .json();
    assert_eq!(rest["batches"][0]["id"], made[2].as_str());
    assert!(rest["next_cursor"].is_null());
    assert_eq!(rest["batches"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_cap_the_dispatcher_holds_a_batch_and_lets_it_in() {
    let env = Env::start().await;
    let stop = CancellationToken::new();
    let dispatcher = env.state.spawn_dispatcher(stop.clone());
    let made = env.upload("?max_running=2", &env.acme, &items(6)).await;
    assert_eq!(made.status, 201, "{}", made.text);
    let id = made.json()["id"].as_str().unwrap().to_string();
    assert_eq!(
        env.sql(&format!(
            "SELECT count(*) FROM sessions WHERE batch_id = '{id}' AND capped"
        )),
        "6",
        "a capped batch's sessions go through the dispatcher"
    );
    // The dispatcher lets the cap's worth in.
    wait_until(
        "the dispatcher to buffer the batch",
        Duration::from_secs(20),
        || async { env.queue.stats("default").await.unwrap().length >= 2 },
    )
    .await;
    assert_eq!(
        env.sql(&format!(
            "SELECT count(*) FROM sessions WHERE batch_id = '{id}' AND NOT held"
        )),
        "2"
    );
    stop.cancel();
    dispatcher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_batch_route_and_listing_see_a_batch_object() {
    let env = Env::start().await;
    let made = env.upload("", &env.acme, &items(2)).await;
    let id = made.json()["id"].as_str().unwrap().to_string();
    // `GET /v1/sessions?batch_id=` lists its sessions, and the old route may join it.
    let (status, listed) = read(
        reqwest::Client::new()
            .get(format!("{}/v1/sessions?batch_id={id}", env.base))
            .bearer_auth(&env.acme)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 2);
    let joined = env
        .post_json(
            &format!("/v1/sessions/batch?batch_id={id}"),
            &env.acme,
            &json!([{"prompt": "late"}]),
        )
        .await;
    assert_eq!(joined.status, 201, "{}", joined.text);
    assert_eq!(joined.json()["batch_id"], id.as_str());
    let v = env
        .get(&format!("/v1/batches/{id}"), &env.acme)
        .await
        .json();
    assert_eq!(v["total"], 3, "counted from its sessions");
    // Cancelling it through the bulk route still works, page by page.
    let bulk = env
        .post_json("/v1/sessions/cancel", &env.acme, &json!({"batch_id": id}))
        .await;
    assert_eq!(bulk.status, 200);
    assert_eq!(bulk.json()["sessions"].as_array().unwrap().len(), 3);
    let v = env
        .get(&format!("/v1/batches/{id}"), &env.acme)
        .await
        .json();
    assert_eq!(
        (v["status"].clone(), v["counts"]["cancelled"].clone()),
        (json!("completed"), json!(3)),
        "every session finished; the batch itself was not cancelled"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_sent_at_once_are_all_written() {
    let env = Env::start().await;
    // More than a scheduler writes at once: the others wait their turn, none is refused.
    let lines = items(40);
    let sent = futures::future::join_all((0..5).map(|_| env.upload("", &env.acme, &lines))).await;
    for a in &sent {
        assert_eq!(a.status, 201, "{}", a.text);
        assert_eq!(a.json()["total"], 40);
    }
    assert_eq!(env.written(), (5, 200));
}
