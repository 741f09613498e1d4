//! `/mcp` against a real Postgres and Redis, attacks first: no key is a 401; a key calls
//! only the tools its scopes allow (a read-only key cannot submit, cancel or decide); one
//! tenant's sessions do not exist for another over any tool; a bad argument is a tool
//! error naming the field; a body that is not JSON-RPC is a JSON-RPC error and changes
//! nothing. Then the official Python SDK (`mcp` from PyPI, in the test cache's virtual
//! environment) runs a session end to end: a worker in process plays the scripted model.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use agentq_agent::spec::SessionSpec;
use agentq_core::auth::{self, Scope};
use agentq_core::config::PolicySection;
use agentq_core::pg::PgStore;
use agentq_core::policy::Policy;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{KeyStore, ListFilter, NewSession, SessionStatus, SessionStore};
use agentq_scheduler::{Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, shared_postgres};
use agentq_worker::{Worker, WorkerSettings};

const ALL: [Scope; 3] = [
    Scope::SessionsRead,
    Scope::SessionsWrite,
    Scope::ApprovalsWrite,
];
const MISSING: &str = "00000000-0000-7000-8000-000000000000";
/// The policy's bound on a request's files here (bytes, in all).
const MAX_INPUT_BYTES: u64 = 4096;
/// The file every held session's workspace holds.
const HELD_FILE: &str = "out/report.txt";

struct Env {
    base: String,
    store: Arc<PgStore>,
    http: reqwest::Client,
    stop: CancellationToken,
    _redis: RedisServer,
    _dir: tempfile::TempDir,
}

impl Drop for Env {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Env {
    /// The API, and a worker playing `script` on the scripted model when one is given.
    async fn start(script: Option<Value>) -> Env {
        Env::start_with(script, |_| {}).await
    }

    /// [`Env::start`] with the scheduler's settings changed by `tune`.
    async fn start_with(script: Option<Value>, tune: impl FnOnce(&mut SchedulerSettings)) -> Env {
        let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&db_url, 8).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let redis = RedisServer::start().unwrap();
        let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
        // The operator lets sessions write files (the default policy offers only tools
        // that read), at the API and at the worker alike.
        let mut section = PolicySection::default();
        section.tools.push("write_file".into());
        section.max_input_bytes = MAX_INPUT_BYTES;
        let policy = Arc::new(Policy::from_section(&section).unwrap());
        let mut settings = SchedulerSettings {
            policy: policy.clone(),
            ..SchedulerSettings::default()
        };
        tune(&mut settings);
        let state = Scheduler::new(store.clone(), queue.clone(), settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let stop = CancellationToken::new();
        let served = stop.clone();
        tokio::spawn(async move {
            axum::serve(listener, router(state))
                .with_graceful_shutdown(served.cancelled_owned())
                .await
        });
        let dir = tempfile::tempdir().unwrap();
        if let Some(script) = script {
            let mut cfg = WorkerSettings {
                consumer: format!("w-{}", agentq_core::new_session_id()),
                workspace_root: dir.path().to_path_buf(),
                read_block: Duration::from_millis(200),
                ..WorkerSettings::default()
            };
            cfg.default_provider = Some("scripted".into());
            cfg.providers.script = Some(script.to_string());
            cfg.policy = policy;
            let worker = Worker::new(store.clone(), queue, cfg);
            let stop = stop.clone();
            tokio::spawn(async move { worker.run(stop).await });
        }
        Env {
            base,
            store,
            http: reqwest::Client::new(),
            stop,
            _redis: redis,
            _dir: dir,
        }
    }

    fn url(&self) -> String {
        format!("{}/mcp", self.base)
    }

    async fn key(&self, tenant: &str, scopes: &[Scope]) -> String {
        let (new, key) = auth::generate(tenant, scopes.to_vec(), None, None).unwrap();
        self.store.create_key(&new).await.unwrap();
        key
    }

    /// POST `body` (raw bytes) to `/mcp` as a streamable HTTP client does.
    async fn post_raw(&self, key: Option<&str>, body: Vec<u8>) -> (u16, Value) {
        let mut req = self
            .http
            .post(self.url())
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(body);
        if let Some(k) = key {
            req = req.bearer_auth(k);
        }
        common::read(req.send().await.unwrap()).await
    }

    async fn rpc(&self, key: Option<&str>, method: &str, params: Value) -> (u16, Value) {
        let body = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
        self.post_raw(key, serde_json::to_vec(&body).unwrap()).await
    }

    /// Call tool `name`: whether the result is an error, and its JSON payload.
    async fn tool(&self, key: &str, name: &str, args: Value) -> (bool, Value) {
        let (s, v) = self
            .rpc(
                Some(key),
                "tools/call",
                json!({"name": name, "arguments": args}),
            )
            .await;
        assert_eq!(s, 200, "{name}: {v}");
        let result = &v["result"];
        assert!(result.is_object(), "{name}: not a tool result: {v}");
        let text = result["content"][0]["text"].as_str().unwrap();
        (
            result["isError"].as_bool().unwrap_or(false),
            serde_json::from_str(text).unwrap(),
        )
    }

    async fn tool_names(&self, key: &str) -> Vec<String> {
        let (s, v) = self.rpc(Some(key), "tools/list", json!({})).await;
        assert_eq!(s, 200, "{v}");
        let mut names: Vec<String> = v["result"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect();
        names.sort();
        names
    }

    async fn sessions_of(&self, tenant: &str) -> Vec<agentq_core::SessionRow> {
        self.store
            .list(&ListFilter {
                tenant: Some(tenant.into()),
                limit: 100,
                ..Default::default()
            })
            .await
            .unwrap()
    }

    /// A session of `tenant` holding a call for approval, with a file in its workspace.
    async fn held_session(&self, tenant: &str) -> (String, String) {
        use agentq_agent::schema::{Message, ToolCall};
        use agentq_agent::state::SessionState;
        use agentq_core::{Claim, LeaseStore};

        let mut new = NewSession::root(SessionSpec::new("hold"), "default").with_tenant(tenant);
        new.files = vec![agentq_core::workspace::InputFile {
            path: HELD_FILE.into(),
            data: b"held".to_vec(),
        }];
        self.store.create_session(&new).await.unwrap();
        let Claim::Acquired { lease, state, .. } = self
            .store
            .claim(&new.id, "w", Duration::from_secs(30), 5)
            .await
            .unwrap()
        else {
            panic!("claim")
        };
        let mut state: SessionState = *state;
        let from = state.messages.len();
        let call = ToolCall {
            id: "call_1".into(),
            name: "write_file".into(),
            arguments: json!({}).into(),
        };
        let mut held = Message::assistant("");
        held.tool_calls = vec![call.clone()];
        state.messages.push(held);
        // As a run that holds a call records it: not started, waiting for a decision.
        state.not_started = vec![call.id.clone()];
        self.store.checkpoint(&lease, &state, from).await.unwrap();
        let row = self.store.get(&new.id).await.unwrap().unwrap();
        self.store
            .suspend(&lease, SessionStatus::AwaitingApproval, row.wake_seq, None)
            .await
            .unwrap();
        (new.id, call.id)
    }
}

/// Every tool, with arguments it accepts for `id` (a held session).
fn every_call(id: &str, call_id: &str) -> Vec<(&'static str, Value)> {
    vec![
        ("get_session", json!({"session_id": id})),
        ("wait_session", json!({"session_id": id, "timeout_secs": 1})),
        ("list_files", json!({"session_id": id})),
        ("read_file", json!({"session_id": id, "path": HELD_FILE})),
        ("list_approvals", json!({"session_id": id})),
        (
            "decide_approval",
            json!({"session_id": id, "tool_call_id": call_id, "approve": false}),
        ),
        ("cancel_session", json!({"session_id": id})),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn no_valid_key_gets_in() {
    let env = Env::start(None).await;
    let bad = format!("aq_{}_{}", "0".repeat(12), "1".repeat(64));
    for key in [None, Some("nonsense"), Some(bad.as_str())] {
        for (method, params) in [
            ("tools/list", json!({})),
            (
                "tools/call",
                json!({"name": "submit_session", "arguments": {"prompt": "x"}}),
            ),
        ] {
            let (s, v) = env.rpc(key, method, params).await;
            assert_eq!(s, 401, "{key:?} {method}: {v}");
            assert_eq!(v["error"]["code"], "unauthorized", "{v}");
        }
    }
    assert!(env.sessions_of("default").await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_calls_only_what_its_scopes_allow() {
    let env = Env::start(None).await;
    let (id, call_id) = env.held_session("acme").await;
    let read_only = env.key("acme", &[Scope::SessionsRead]).await;
    assert_eq!(
        env.tool_names(&read_only).await,
        [
            "get_session",
            "list_approvals",
            "list_files",
            "read_file",
            "wait_session"
        ]
    );
    for (name, args, scope) in [
        ("submit_session", json!({"prompt": "x"}), "sessions:write"),
        (
            "cancel_session",
            json!({"session_id": id}),
            "sessions:write",
        ),
        (
            "decide_approval",
            json!({"session_id": id, "tool_call_id": call_id, "approve": true}),
            "approvals:write",
        ),
    ] {
        let (err, v) = env.tool(&read_only, name, args).await;
        assert!(err, "{name}: {v}");
        assert_eq!(v["error"]["code"], "forbidden", "{name}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(scope),
            "{name}: {v}"
        );
    }
    // A key that may only submit cannot read.
    let write_only = env.key("acme", &[Scope::SessionsWrite]).await;
    assert_eq!(
        env.tool_names(&write_only).await,
        ["cancel_session", "submit_session"]
    );
    let (err, v) = env
        .tool(&write_only, "get_session", json!({"session_id": id}))
        .await;
    assert!(err && v["error"]["code"] == "forbidden", "{v}");

    // Nothing was created, cancelled or decided.
    let rows = env.sessions_of("acme").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, SessionStatus::AwaitingApproval);
    assert!(!rows[0].cancel_requested);
    let full = env.key("acme", &ALL).await;
    let (err, v) = env
        .tool(&full, "list_approvals", json!({"session_id": id}))
        .await;
    assert!(!err, "{v}");
    assert_eq!(v["approvals"][0]["tool_call_id"], call_id, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn another_tenants_session_does_not_exist() {
    let env = Env::start(None).await;
    let (id, call_id) = env.held_session("acme").await;
    let globex = env.key("globex", &ALL).await;
    for ((name, args), (_, missing_args)) in every_call(&id, &call_id)
        .into_iter()
        .zip(every_call(MISSING, &call_id))
    {
        let (err, v) = env.tool(&globex, name, args).await;
        let (merr, mv) = env.tool(&globex, name, missing_args).await;
        assert!(err && merr, "{name}: {v} / {mv}");
        assert_eq!(v["error"]["code"], "not_found", "{name}: {v}");
        assert_eq!(
            v.to_string().replace(&id, MISSING),
            mv.to_string(),
            "{name}: another tenant's session must look missing"
        );
    }
    // Nor does it show among the calls waiting for a decision.
    let (err, v) = env.tool(&globex, "list_approvals", json!({})).await;
    assert!(!err, "{v}");
    assert_eq!(v["approvals"], json!([]), "{v}");
    // Globex touched nothing of acme's.
    let row = env.store.get(&id).await.unwrap().unwrap();
    assert_eq!(row.status, SessionStatus::AwaitingApproval);
    assert!(!row.cancel_requested);
    let acme = env.key("acme", &ALL).await;
    let (err, v) = env.tool(&acme, "list_approvals", json!({})).await;
    assert!(!err, "{v}");
    assert_eq!(v["approvals"][0]["session_id"], id, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_argument_names_the_field() {
    let env = Env::start(None).await;
    let (id, _) = env.held_session("acme").await;
    let key = env.key("acme", &ALL).await;
    let file = |p: &str| json!({"path": p, "content": "x"});
    let cases = [
        ("submit_session", json!({}), "prompt"),
        ("submit_session", json!({"prompt": "  "}), "prompt"),
        (
            "submit_session",
            json!({"prompt": "x", "temperature": 7}),
            "temperature",
        ),
        (
            "submit_session",
            json!({"prompt": "x", "mode": "yolo"}),
            "mode",
        ),
        (
            "submit_session",
            json!({"prompt": "x", "history_window": 3}),
            "history_window",
        ),
        (
            "submit_session",
            json!({"prompt": "x", "api_key": "sk-1"}),
            "api_key",
        ),
        ("submit_session", json!({"prompt": "x\u{0}"}), "prompt"),
        (
            "submit_session",
            json!({"prompt": "x", "files": [file("a"), file("a")]}),
            "files[1].path",
        ),
        (
            "submit_session",
            json!({"prompt": "x", "files": [file("../etc/passwd")]}),
            "files[\"../etc/passwd\"]",
        ),
        (
            "submit_session",
            json!({"prompt": "x", "files": [{"path": "a"}]}),
            "files[0].content",
        ),
        ("get_session", json!({}), "session_id"),
        ("get_session", json!({"session_id": 5}), "session_id"),
        (
            "wait_session",
            json!({"session_id": id, "timeout_secs": 100_000}),
            "timeout_secs",
        ),
        (
            "read_file",
            json!({"session_id": id, "path": "../x"}),
            "path",
        ),
        (
            "read_file",
            json!({"session_id": id, "path": HELD_FILE, "max_bytes": 0}),
            "max_bytes",
        ),
        (
            "decide_approval",
            json!({"session_id": id, "tool_call_id": "call_1", "approve": "yes"}),
            "approve",
        ),
        (
            "decide_approval",
            json!({"session_id": id, "tool_call_id": "nope", "approve": true}),
            "tool_call_id",
        ),
    ];
    for (name, args, field) in cases {
        let (err, v) = env.tool(&key, name, args.clone()).await;
        assert!(err, "{name} {args}: {v}");
        assert_eq!(v["error"]["field"], field, "{name} {args}: {v}");
    }
    // The one session is as it was, and none other was made.
    let rows = env.sessions_of("acme").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, SessionStatus::AwaitingApproval);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_limits_of_post_v1_sessions_hold() {
    let env = Env::start(None).await;
    let key = env.key("acme", &ALL).await;
    // Files past the policy's bytes: the REST check, naming the file.
    let big = "x".repeat(usize::try_from(MAX_INPUT_BYTES).unwrap() + 1);
    let (err, v) = env
        .tool(
            &key,
            "submit_session",
            json!({"prompt": "x", "files": [{"path": "big.txt", "content": big}]}),
        )
        .await;
    assert!(err, "{v}");
    assert_eq!(v["error"]["code"], "too_large", "{v}");
    assert_eq!(v["error"]["field"], "files[\"big.txt\"]", "{v}");
    // The files' bound is what the schema says.
    let (_, tools) = env.rpc(Some(&key), "tools/list", json!({})).await;
    let submit = tools["result"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "submit_session")
        .unwrap();
    let files = &submit["inputSchema"]["properties"]["files"];
    assert_eq!(files["maxItems"], 1000, "{files}");
    assert!(
        files["description"].as_str().unwrap().contains("4096"),
        "{files}"
    );
    assert_eq!(submit["inputSchema"]["additionalProperties"], false);
    // A body past the limit of `POST /v1/sessions` (two prompts, the files twice over and
    // a MiB) is refused before it is read whole.
    let huge = "y".repeat(4 * 1024 * 1024);
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
        "params": {"name": "submit_session", "arguments": {"prompt": huge}}});
    let (s, v) = env
        .post_raw(Some(&key), serde_json::to_vec(&body).unwrap())
        .await;
    assert_eq!(s, 413, "{v}");
    assert_eq!(v["error"]["code"], "too_large", "{v}");
    assert!(env.sessions_of("acme").await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn what_is_not_json_rpc_is_a_json_rpc_error() {
    let env = Env::start(None).await;
    let key = env.key("acme", &ALL).await;
    let submit = r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"submit_session","arguments":{"prompt":"a","prompt":"b"}}}"#;
    for (body, code, says) in [
        ("not json at all", -32700, ""),
        (
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call""#,
            -32700,
            "",
        ),
        (r#"{"hello": "world"}"#, -32600, ""),
        ("[]", -32600, ""),
        (r#"{"jsonrpc":"2.0","id":1}"#, -32600, ""),
        (submit, -32600, "params.arguments.prompt"),
    ] {
        let (s, v) = env.post_raw(Some(&key), body.as_bytes().to_vec()).await;
        assert_eq!(s, 400, "{body}: {v}");
        assert_eq!(v["jsonrpc"], "2.0", "{body}: {v}");
        assert_eq!(v["error"]["code"], code, "{body}: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(says),
            "{body}: {v}"
        );
    }
    // A tool that does not exist is the protocol's error, not a result.
    let (s, v) = env
        .rpc(
            Some(&key),
            "tools/call",
            json!({"name": "drop_tables", "arguments": {}}),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["error"]["code"], -32602, "{v}");
    assert!(env.sessions_of("acme").await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_session_tools_do_what_their_routes_do() {
    let env = Env::start(None).await;
    let key = env.key("acme", &ALL).await;
    let (err, v) = env
        .tool(
            &key,
            "submit_session",
            json!({"prompt": "hi", "idempotency_key": "k1", "priority": 7,
                   "files": [{"path": "a/b.txt", "content": "héllo"}]}),
        )
        .await;
    assert!(!err, "{v}");
    assert_eq!(
        (v["status"].as_str(), v["created"].as_bool()),
        (Some("queued"), Some(true))
    );
    let id = v["id"].as_str().unwrap().to_string();
    // A repeat of the key answers with the same session; another request with it is refused.
    let (err, again) = env
        .tool(
            &key,
            "submit_session",
            json!({"prompt": "hi", "idempotency_key": "k1", "priority": 7,
                   "files": [{"path": "a/b.txt", "content": "héllo"}]}),
        )
        .await;
    assert!(!err, "{again}");
    assert_eq!((&again["id"], &again["created"]), (&v["id"], &json!(false)));
    let (err, other) = env
        .tool(
            &key,
            "submit_session",
            json!({"prompt": "bye", "idempotency_key": "k1"}),
        )
        .await;
    assert!(err, "{other}");
    assert_eq!(other["error"]["field"], "idempotency_key");

    let row = env.store.get(&id).await.unwrap().unwrap();
    assert_eq!((row.tenant.as_str(), row.priority), ("acme", 7));
    let (_, got) = env
        .tool(&key, "get_session", json!({"session_id": id}))
        .await;
    assert_eq!(got["status"], "queued", "{got}");
    let (_, files) = env
        .tool(&key, "list_files", json!({"session_id": id}))
        .await;
    assert_eq!(files["files"][0]["path"], "a/b.txt", "{files}");
    let (_, f) = env
        .tool(
            &key,
            "read_file",
            json!({"session_id": id, "path": "a/b.txt", "max_bytes": 2}),
        )
        .await;
    // Cut inside `é`: the text up to it, said to be cut, and where the rest begins.
    assert_eq!(
        (&f["content"], &f["encoding"], &f["truncated"], &f["size"]),
        (&json!("h"), &json!("utf-8"), &json!(true), &json!(6))
    );
    assert_eq!(f["next_offset"], 1, "{f}");
    let (_, rest) = env
        .tool(
            &key,
            "read_file",
            json!({"session_id": id, "path": "a/b.txt", "offset": 1}),
        )
        .await;
    assert_eq!(
        (&rest["content"], &rest["truncated"], &rest["next_offset"]),
        (&json!("éllo"), &json!(false), &Value::Null)
    );
    let (err, past) = env
        .tool(
            &key,
            "read_file",
            json!({"session_id": id, "path": "a/b.txt", "offset": 7}),
        )
        .await;
    assert!(err && past["error"]["field"] == "offset", "{past}");
    // No worker: the wait runs out and says so.
    let (err, w) = env
        .tool(
            &key,
            "wait_session",
            json!({"session_id": id, "timeout_secs": 1}),
        )
        .await;
    assert!(!err, "{w}");
    assert_eq!(
        (&w["ended"], &w["session"]["status"]),
        (&json!(false), &json!("queued"))
    );
    let (err, c) = env
        .tool(&key, "cancel_session", json!({"session_id": id}))
        .await;
    assert!(!err, "{c}");
    // Cancelled at once (the REST answer leaves `cancel_requested` out when false).
    assert_eq!(
        (&c["status"], &c["cancel_requested"]),
        (&json!("cancelled"), &Value::Null)
    );
    let (err, w) = env
        .tool(&key, "wait_session", json!({"session_id": id}))
        .await;
    assert!(!err && w["ended"] == json!(true), "{w}");
    let (err, again) = env
        .tool(&key, "cancel_session", json!({"session_id": id}))
        .await;
    assert!(
        err && again["error"]["code"] == "already_finished",
        "{again}"
    );

    // A session holding a call: the wait returns at once, and a decision resumes it.
    let (held, call_id) = env.held_session("acme").await;
    let (_, w) = env
        .tool(
            &key,
            "wait_session",
            json!({"session_id": held, "timeout_secs": 60}),
        )
        .await;
    assert_eq!(w["ended"], json!(false), "{w}");
    assert_eq!(
        w["session"]["pending_approvals"][0]["tool_call_id"], call_id,
        "{w}"
    );
    let (err, d) = env
        .tool(
            &key,
            "decide_approval",
            json!({"session_id": held, "tool_call_id": call_id, "approve": false, "reason": "no"}),
        )
        .await;
    assert!(!err, "{d}");
    assert_eq!(
        (&d["approve"], &d["resumed"]),
        (&json!(false), &json!(true))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_python_sdk_runs_a_session() {
    let python = tokio::task::spawn_blocking(agentq_testkit::python::mcp_python)
        .await
        .unwrap()
        .unwrap();
    let script = json!({"turns": [
        {"text": "writing", "tool_calls": [{"name": "write_file", "arguments": {
            "path": "out/summary.txt", "content": "summary of the notes"}}]},
        {"text": "done"}
    ]});
    let env = Env::start(Some(script)).await;
    let key = env.key("acme", &ALL).await;
    let client = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let url = env.url();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .arg(client)
            .args([url.as_str(), key.as_str(), "summarise notes.txt"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the client failed: {stderr}");
    let seen: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{stderr}", String::from_utf8_lossy(&out.stdout)));
    assert_eq!(seen["server"], "agentq", "{seen}");
    assert_eq!(
        seen["tools"],
        json!([
            "cancel_session",
            "decide_approval",
            "get_session",
            "list_approvals",
            "list_files",
            "read_file",
            "submit_session",
            "wait_session"
        ])
    );
    assert_eq!(seen["submit_required"], json!(["prompt"]));
    assert_eq!(
        (&seen["submit"]["is_error"], &seen["submit"]["created"]),
        (&json!(false), &json!(true)),
        "{seen}"
    );
    assert_eq!(seen["ended"], json!(true), "{seen}");
    assert_eq!(seen["status"], "completed", "{seen}");
    assert_eq!(seen["result"], "done", "{seen}");
    assert_eq!(seen["files"], json!(["notes.txt", "out/summary.txt"]));
    assert_eq!(seen["notes.txt"]["content"], "hello from python", "{seen}");
    assert_eq!(seen["out/summary.txt"]["content"], "summary of the notes");
    assert_eq!(
        (&seen["bad"]["is_error"], &seen["bad"]["error"]["field"]),
        (&json!(true), &json!("temperature")),
        "{seen}"
    );
    // The session belongs to the key's tenant.
    let rows = env.sessions_of("acme").await;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id, seen["submit"]["id"].as_str().unwrap());
}

// --- Attacks on the boundaries: each passes only if the boundary holds ---

impl Env {
    /// `POST /v1/sessions` with `body`, as the REST client would.
    async fn rest_submit(&self, key: &str, body: &Value) -> (u16, Value) {
        let resp = self
            .http
            .post(format!("{}/v1/sessions", self.base))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .unwrap();
        common::read(resp).await
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_session_over_mcp_is_refused_exactly_as_post_v1_sessions_refuses_it() {
    let env = Env::start(None).await;
    let key = env.key("acme", &ALL).await;
    for args in [
        json!({"prompt": "x", "tools": ["shell"]}),
        json!({"prompt": "x", "tools": ["mcp__time__*"]}),
        json!({"prompt": "x", "tools": ["mcp__time__get_current_time"]}),
        json!({"prompt": "x", "provider": "evil"}),
        json!({"prompt": "x", "tools": ["spawn_agent", "../shell"]}),
        json!({"prompt": "x", "tools": ["*"]}),
        json!({"prompt": "x", "max_iterations": 0}),
        json!({"prompt": "x", "token_budget": -1}),
        json!({"prompt": "x", "timeout_secs": u64::MAX}),
        json!({"prompt": "x", "queue": "../x"}),
        json!({"prompt": "x", "priority": 1_000_000}),
        json!({"prompt": "x", "workspace_from": MISSING}),
    ] {
        let (err, mcp) = env.tool(&key, "submit_session", args.clone()).await;
        let (status, rest) = env.rest_submit(&key, &args).await;
        assert!(err, "{args}: accepted over /mcp: {mcp}");
        assert!((400..500).contains(&status), "{args}: REST {status} {rest}");
        assert_eq!(mcp["error"], rest["error"], "{args}");
    }
    // What the REST body has and the tool does not take is refused, never passed on.
    for field in ["base_url", "api_key", "tenant", "parent_id", "depth"] {
        let (err, v) = env
            .tool(&key, "submit_session", json!({"prompt": "x", field: "y"}))
            .await;
        assert!(err, "{field}: {v}");
        assert_eq!(v["error"]["field"], field, "{v}");
    }
    assert!(env.sessions_of("acme").await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn another_tenants_session_is_no_workspace_and_its_idempotency_key_is_its_own() {
    let env = Env::start(None).await;
    let (theirs, _) = env.held_session("acme").await;
    let acme = env.key("acme", &ALL).await;
    let globex = env.key("globex", &ALL).await;
    // Acme's file cannot be copied into a globex session.
    let (err, v) = env
        .tool(
            &globex,
            "submit_session",
            json!({"prompt": "x", "workspace_from": theirs}),
        )
        .await;
    let (merr, mv) = env
        .tool(
            &globex,
            "submit_session",
            json!({"prompt": "x", "workspace_from": MISSING}),
        )
        .await;
    assert!(err && merr, "{v} / {mv}");
    assert_eq!(v.to_string().replace(&theirs, MISSING), mv.to_string());
    // The same idempotency key in two tenants makes two sessions, each its tenant's.
    let args = json!({"prompt": "same", "idempotency_key": "k-1"});
    let (err, a) = env.tool(&acme, "submit_session", args.clone()).await;
    assert!(!err, "{a}");
    let (err, g) = env.tool(&globex, "submit_session", args).await;
    assert!(!err, "{g}");
    assert_ne!(a["id"], g["id"]);
    assert_eq!(g["created"], true, "{g}");
    assert_eq!(env.sessions_of("globex").await.len(), 1);
    assert!(env.sessions_of("globex").await[0].id != theirs);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_batch_a_notification_or_an_answer_creates_nothing() {
    let env = Env::start(None).await;
    let key = env.key("acme", &ALL).await;
    let call = |id: u32| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "submit_session", "arguments": {"prompt": "x"}}})
    };
    let batch = serde_json::to_vec(&json!([call(1), call(2), call(3)])).unwrap();
    let (s, v) = env.post_raw(Some(&key), batch).await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["error"]["code"], -32600, "{v}");
    // A tools/call sent as a notification (no id) runs nothing.
    let note = json!({"jsonrpc": "2.0", "method": "tools/call",
        "params": {"name": "submit_session", "arguments": {"prompt": "x"}}});
    let (s, v) = env
        .post_raw(Some(&key), serde_json::to_vec(&note).unwrap())
        .await;
    assert!(s == 202 || s == 400, "{s} {v}");
    // An answer to a request the server never made is taken for nothing.
    let answer = json!({"jsonrpc": "2.0", "id": 99, "result": {}});
    let (s, v) = env
        .post_raw(Some(&key), serde_json::to_vec(&answer).unwrap())
        .await;
    assert!(s == 202 || s == 400, "{s} {v}");
    assert!(env.sessions_of("acme").await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn read_file_offsets_and_wait_bounds_out_of_range_name_their_field() {
    let env = Env::start(None).await;
    let (id, _) = env.held_session("acme").await;
    let key = env.key("acme", &ALL).await;
    for (name, args, field) in [
        (
            "read_file",
            json!({"session_id": id, "path": HELD_FILE, "offset": -1}),
            "offset",
        ),
        (
            "read_file",
            json!({"session_id": id, "path": HELD_FILE, "offset": u64::MAX}),
            "offset",
        ),
        (
            "read_file",
            json!({"session_id": id, "path": HELD_FILE, "offset": 5}),
            "offset",
        ),
        (
            "read_file",
            json!({"session_id": id, "path": HELD_FILE, "max_bytes": u64::MAX}),
            "max_bytes",
        ),
        (
            "read_file",
            json!({"session_id": id, "path": HELD_FILE, "offset": 1.5}),
            "offset",
        ),
        (
            "read_file",
            json!({"session_id": id, "path": "/etc/passwd"}),
            "path",
        ),
        (
            "read_file",
            json!({"session_id": id, "path": "out/../../x"}),
            "path",
        ),
        (
            "wait_session",
            json!({"session_id": id, "timeout_secs": 0}),
            "timeout_secs",
        ),
        (
            "wait_session",
            json!({"session_id": id, "timeout_secs": -5}),
            "timeout_secs",
        ),
    ] {
        let (err, v) = env.tool(&key, name, args.clone()).await;
        assert!(err, "{name} {args}: {v}");
        assert_eq!(v["error"]["field"], field, "{name} {args}: {v}");
    }
    // The end of the file is a valid offset: nothing more to read.
    let (err, v) = env
        .tool(
            &key,
            "read_file",
            json!({"session_id": id, "path": HELD_FILE, "offset": 4}),
        )
        .await;
    assert!(!err, "{v}");
    assert_eq!(v["content"], "", "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn waits_past_the_keys_stream_cap_are_refused_and_an_abandoned_wait_lets_go() {
    let env = Env::start_with(None, |s| s.streams.per_key = 2).await;
    let key = env.key("acme", &ALL).await;
    // No worker: the session stays queued, so every wait on it holds a permit.
    let (err, made) = env
        .tool(&key, "submit_session", json!({"prompt": "x"}))
        .await;
    assert!(!err, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let long = json!({"session_id": id, "timeout_secs": 120});
    // Each holder asks again while it is refused (the probes below hold a permit for a
    // moment too), until its wait is the one that holds.
    let holders: Vec<_> = (0..2)
        .map(|_| {
            let (http, url, key) = (env.http.clone(), env.url(), key.clone());
            let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                "params": {"name": "wait_session", "arguments": long.clone()}});
            tokio::spawn(async move {
                loop {
                    let resp = http
                        .post(&url)
                        .bearer_auth(&key)
                        .header("accept", "application/json, text/event-stream")
                        .json(&body)
                        .send()
                        .await;
                    let text = match resp {
                        Ok(r) => r.text().await.unwrap_or_default(),
                        Err(e) => return e.to_string(),
                    };
                    if !text.contains("overloaded") {
                        return text;
                    }
                }
            })
        })
        .collect();
    // A third wait is refused (a 503's error as a tool result) once both hold theirs.
    let short = json!({"session_id": id, "timeout_secs": 1});
    let mut refused = None;
    for _ in 0..60 {
        let (err, v) = env.tool(&key, "wait_session", short.clone()).await;
        if err {
            refused = Some(v);
            break;
        }
    }
    let v = refused.expect("the key's cap never refused a wait");
    assert_eq!(v["error"]["code"], "overloaded", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("this API key"),
        "{v}"
    );
    // The callers go away: their waits end and give their permits back.
    for h in holders {
        h.abort();
    }
    let mut served = None;
    for _ in 0..60 {
        let (err, v) = env.tool(&key, "wait_session", short.clone()).await;
        if !err {
            served = Some(v);
            break;
        }
    }
    let v = served.expect("an abandoned wait kept its permit");
    assert_eq!(v["ended"], false, "{v}");
}
