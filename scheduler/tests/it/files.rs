//! A session's files through the API, against a real Postgres and Redis: files given at
//! submit (text and base64, single and batch) are listed and downloaded byte for byte, as
//! one file and as a tar; `workspace_from` forks another session's files. Then the
//! attacks: every bad path, shape and size at submit is a 4xx naming the file and leaves
//! nothing behind; a download never answers a file outside the tree (traversal sent raw,
//! past any client's URL normalisation); another tenant's session, its files and its
//! workspace as a `workspace_from` all look exactly like missing ones; what a browser
//! could render is served so that it will not; and with Postgres killed, files in and out
//! are a 503, and once it is back the refused request left nothing and the committed
//! files are intact.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use base64::Engine as _;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use agentq_core::auth::{self, Scope};
use agentq_core::config::{PolicySection, TenantPolicySection};
use agentq_core::pg::PgStore;
use agentq_core::policy::Policy;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{KeyStore, ListFilter, SessionStore};
use agentq_scheduler::{Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, shared_postgres};

use common::wait_until;

struct Env {
    addr: SocketAddr,
    base: String,
    store: Arc<PgStore>,
    _redis: RedisServer,
    /// Keys of the tenants `acme` and `globex` (read and write).
    acme: String,
    globex: String,
}

/// A tenant of its own with a narrow file policy.
const TINY_TENANT: &str = "tiny";

impl Env {
    async fn start() -> Env {
        let db_url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&db_url, 8).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let redis = RedisServer::start().unwrap();
        let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
        let mut section = PolicySection::default();
        section.tenants.insert(
            TINY_TENANT.into(),
            TenantPolicySection {
                max_input_files: Some(2),
                max_input_bytes: Some(8),
                max_path_depth: Some(2),
                ..Default::default()
            },
        );
        let settings = SchedulerSettings {
            policy: Arc::new(Policy::from_section(&section).unwrap()),
            ..SchedulerSettings::default()
        };
        let state = Scheduler::new(store.clone(), queue, settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router(state)).await });
        let key = |tenant: &'static str| {
            let store = store.clone();
            async move {
                let (new, key) = auth::generate(
                    tenant,
                    vec![Scope::SessionsRead, Scope::SessionsWrite],
                    None,
                    None,
                )
                .unwrap();
                store.create_key(&new).await.unwrap();
                key
            }
        };
        let (acme, globex) = (key("acme").await, key("globex").await);
        Env {
            addr,
            base: format!("http://{addr}"),
            store,
            _redis: redis,
            acme,
            globex,
        }
    }

    async fn key_of(&self, tenant: &str) -> String {
        let (new, key) = auth::generate(
            tenant,
            vec![Scope::SessionsRead, Scope::SessionsWrite],
            None,
            None,
        )
        .unwrap();
        self.store.create_key(&new).await.unwrap();
        key
    }

    async fn post(&self, path: &str, key: &str, body: &Value) -> (u16, Value) {
        let r = reqwest::Client::new()
            .post(format!("{}{path}", self.base))
            .bearer_auth(key)
            .json(body)
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    /// The status, headers and bytes of a GET.
    async fn get_raw(&self, path: &str, key: &str) -> (u16, reqwest::header::HeaderMap, Vec<u8>) {
        let r = reqwest::Client::new()
            .get(format!("{}{path}", self.base))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        let h = r.headers().clone();
        (s, h, r.bytes().await.unwrap().to_vec())
    }

    async fn get(&self, path: &str, key: &str) -> (u16, Value) {
        let (s, _, b) = self.get_raw(path, key).await;
        (s, serde_json::from_slice(&b).unwrap_or(Value::Null))
    }

    /// A request line sent as is, for paths a client library would normalise first:
    /// the status of the answer and its body.
    async fn raw_get(&self, target: &str, key: &str) -> (u16, String) {
        let mut c = tokio::net::TcpStream::connect(self.addr).await.unwrap();
        let req = format!(
            "GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n\
             Connection: close\r\n\r\n"
        );
        c.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        let text = String::from_utf8_lossy(&out).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        (status, text)
    }

    async fn sessions_of(&self, tenant: &str) -> usize {
        self.store
            .list(&ListFilter {
                tenant: Some(tenant.into()),
                limit: 1000,
                ..Default::default()
            })
            .await
            .unwrap()
            .len()
    }
}

fn field(v: &Value) -> &str {
    v["error"]["field"].as_str().unwrap_or("")
}

fn sha(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

#[tokio::test(flavor = "multi_thread")]
async fn files_in_at_submit_and_out_as_files_and_a_tar() {
    let env = Env::start().await;
    let binary: Vec<u8> = (0..=255u8).chain([0, 0, 255]).collect();
    let (s, v) = env
        .post(
            "/v1/sessions",
            &env.acme,
            &json!({"prompt": "p", "files": {
                "README.md": "# hi\n",
                "data/./in.bin": {"base64": b64(&binary)},
                "web/page.html": "<script>alert(1)</script>",
                "deep/a/b/c.txt": "c",
                "empty": "",
            }}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();

    let (s, list) = env
        .get(&format!("/v1/sessions/{id}/files"), &env.acme)
        .await;
    assert_eq!(s, 200, "{list}");
    let files = list["files"].as_array().unwrap();
    let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(
        paths,
        [
            "README.md",
            "data/in.bin",
            "deep/a/b/c.txt",
            "empty",
            "web/page.html"
        ]
    );
    let bin = &files[1];
    assert_eq!(bin["size"], binary.len());
    assert_eq!(bin["sha256"], sha(&binary));
    assert_eq!(bin["modified_at_seq"], 0);

    // One file: the bytes, a content type, never sniffed.
    let (s, h, body) = env
        .get_raw(&format!("/v1/sessions/{id}/files/data/in.bin"), &env.acme)
        .await;
    assert_eq!(s, 200);
    assert_eq!(body, binary);
    assert_eq!(h["content-type"], "application/octet-stream");
    assert_eq!(h["x-content-type-options"], "nosniff");
    let (s, h, body) = env
        .get_raw(&format!("/v1/sessions/{id}/files/README.md"), &env.acme)
        .await;
    assert_eq!((s, body.as_slice()), (200, &b"# hi\n"[..]));
    assert_eq!(h["content-type"], "text/plain; charset=utf-8");
    // A page a browser would render is text, and a download.
    let (s, h, _) = env
        .get_raw(&format!("/v1/sessions/{id}/files/web/page.html"), &env.acme)
        .await;
    assert_eq!(s, 200);
    assert_eq!(h["content-type"], "text/plain; charset=utf-8");
    assert!(
        h["content-disposition"]
            .to_str()
            .unwrap()
            .starts_with("attachment")
    );
    assert!(
        h["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("sandbox")
    );
    // `/` percent-encoded, and `.` parts, name the same file.
    let (s, _, body) = env
        .get_raw(
            &format!("/v1/sessions/{id}/files/deep%2Fa/./b%2Fc.txt"),
            &env.acme,
        )
        .await;
    assert_eq!((s, body.as_slice()), (200, &b"c"[..]));
    let (s, v) = env
        .get(&format!("/v1/sessions/{id}/files/nope.txt"), &env.acme)
        .await;
    assert_eq!(s, 404, "{v}");

    // Everything as a tar: regular files only, the same bytes.
    let (s, h, tar_bytes) = env
        .get_raw(&format!("/v1/sessions/{id}/files?format=tar"), &env.acme)
        .await;
    assert_eq!(s, 200);
    assert_eq!(h["content-type"], "application/x-tar");
    let mut got = BTreeMap::new();
    let mut archive = tar::Archive::new(tar_bytes.as_slice());
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        assert_eq!(e.header().entry_type(), tar::EntryType::Regular);
        let p = e.path().unwrap().to_string_lossy().into_owned();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data).unwrap();
        got.insert(p, data);
    }
    assert_eq!(got.len(), 5);
    assert_eq!(got["data/in.bin"], binary);
    assert_eq!(got["web/page.html"], b"<script>alert(1)</script>");
    assert_eq!(got["empty"], b"");
    let (s, v) = env
        .get(&format!("/v1/sessions/{id}/files?format=zip"), &env.acme)
        .await;
    assert_eq!((s, field(&v)), (422, "format"), "{v}");

    // A batch item's files are its own.
    let (s, v) = env
        .post(
            "/v1/sessions/batch",
            &env.acme,
            &json!([{"prompt": "a"}, {"prompt": "b", "files": {"x/y": "z"}}]),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let (a, b) = (
        v["sessions"][0]["id"].as_str().unwrap(),
        v["sessions"][1]["id"].as_str().unwrap(),
    );
    let (_, la) = env.get(&format!("/v1/sessions/{a}/files"), &env.acme).await;
    let (_, lb) = env.get(&format!("/v1/sessions/{b}/files"), &env.acme).await;
    assert_eq!(la["files"], json!([]));
    assert_eq!(lb["files"][0]["path"], "x/y");

    // Idempotency keys bind the files too.
    let once = json!({"prompt": "p", "idempotency_key": "k", "files": {"a": "1"}});
    let (s, first) = env.post("/v1/sessions", &env.acme, &once).await;
    assert_eq!(s, 201);
    let (s, again) = env.post("/v1/sessions", &env.acme, &once).await;
    assert_eq!((s, &again["id"]), (200, &first["id"]));
    let other = json!({"prompt": "p", "idempotency_key": "k", "files": {"a": "2"}});
    let (s, v) = env.post("/v1/sessions", &env.acme, &other).await;
    assert_eq!(s, 409, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn workspace_from_forks_within_a_tenant_only() {
    let env = Env::start().await;
    let (_, v) = env
        .post(
            "/v1/sessions",
            &env.acme,
            &json!({"prompt": "src", "files": {"a.txt": "from source", "keep.txt": "k"}}),
        )
        .await;
    let src = v["id"].as_str().unwrap().to_string();
    let (s, v) = env
        .post(
            "/v1/sessions",
            &env.acme,
            &json!({"prompt": "fork", "workspace_from": src, "files": {"a.txt": "mine", "b.txt": "new"}}),
        )
        .await;
    assert_eq!(s, 201, "{v}");
    let fork = v["id"].as_str().unwrap().to_string();
    let read = |id: String, p: &'static str| {
        let env = &env;
        async move {
            let (s, _, b) = env
                .get_raw(&format!("/v1/sessions/{id}/files/{p}"), &env.acme)
                .await;
            (s, String::from_utf8(b).unwrap())
        }
    };
    assert_eq!(read(fork.clone(), "keep.txt").await, (200, "k".into()));
    assert_eq!(read(fork.clone(), "a.txt").await, (200, "mine".into()));
    assert_eq!(read(fork.clone(), "b.txt").await.1, "new");
    // The source is as it was.
    assert_eq!(
        read(src.clone(), "a.txt").await,
        (200, "from source".into())
    );
    assert_eq!(read(src.clone(), "b.txt").await.0, 404);

    // Another tenant's session as a source is refused exactly as an unknown one.
    let before = env.sessions_of("globex").await;
    let (s, theirs) = env
        .post(
            "/v1/sessions",
            &env.globex,
            &json!({"prompt": "steal", "workspace_from": src}),
        )
        .await;
    let missing = "00000000-0000-7000-8000-000000000000";
    let (ms, unknown) = env
        .post(
            "/v1/sessions",
            &env.globex,
            &json!({"prompt": "steal", "workspace_from": missing}),
        )
        .await;
    assert_eq!((s, field(&theirs)), (422, "workspace_from"), "{theirs}");
    assert_eq!(ms, s);
    assert_eq!(
        theirs.to_string().replace(&src, missing),
        unknown.to_string()
    );
    let (s, v) = env
        .post(
            "/v1/sessions/batch",
            &env.globex,
            &json!([{"prompt": "ok"}, {"prompt": "steal", "workspace_from": src}]),
        )
        .await;
    assert_eq!((s, field(&v)), (422, "[1].workspace_from"), "{v}");
    for junk in [
        "not-a-session-id",
        "'; DROP TABLE sessions; --",
        "\u{202e}x",
    ] {
        let (s, v) = env
            .post(
                "/v1/sessions",
                &env.globex,
                &json!({"prompt": "p", "workspace_from": junk}),
            )
            .await;
        assert_eq!((s, field(&v)), (422, "workspace_from"), "{junk}: {v}");
    }
    assert_eq!(env.sessions_of("globex").await, before);

    // Nor can another tenant read the files: every route answers as for a missing session.
    for p in ["/files", "/files?format=tar", "/files/a.txt"] {
        let (s, v) = env
            .get(&format!("/v1/sessions/{src}{p}"), &env.globex)
            .await;
        let (ms, mv) = env
            .get(&format!("/v1/sessions/{missing}{p}"), &env.globex)
            .await;
        assert_eq!((s, ms), (404, 404), "{p}: {v}");
        assert_eq!(v.to_string().replace(&src, missing), mv.to_string(), "{p}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_files_are_refused_naming_the_file_and_leave_nothing() {
    let env = Env::start().await;
    let one = |files: Value| json!({"prompt": "p", "files": files});
    let cases: Vec<(Value, u16, String)> = vec![
        (one(json!({"../x": "a"})), 422, r#"files["../x"]"#.into()),
        (
            one(json!({"a/../../x": "a"})),
            422,
            r#"files["a/../../x"]"#.into(),
        ),
        (
            one(json!({"/etc/passwd": "a"})),
            422,
            r#"files["/etc/passwd"]"#.into(),
        ),
        (one(json!({"C:/x": "a"})), 422, r#"files["C:/x"]"#.into()),
        (
            one(json!({"a\\..\\x": "a"})),
            422,
            r#"files["a\\..\\x"]"#.into(),
        ),
        (one(json!({"a//b": "a"})), 422, r#"files["a//b"]"#.into()),
        (one(json!({"a\nb": "a"})), 422, r#"files["a\nb"]"#.into()),
        (
            one(json!({"a\u{202e}b": "a"})),
            422,
            "files[\"a\u{202e}b\"]".into(),
        ),
        (
            one(json!({".git/hooks/post-checkout": "a"})),
            422,
            r#"files[".git/hooks/post-checkout"]"#.into(),
        ),
        (
            one(json!({"x/.GIT./config": "a"})),
            422,
            r#"files["x/.GIT./config"]"#.into(),
        ),
        (one(json!({".": "a"})), 422, r#"files["."]"#.into()),
        (
            one(json!({"a": "x", "a/b": "y"})),
            422,
            r#"files["a/b"]"#.into(),
        ),
        (
            one(json!({"a/b": "x", "a": "y"})),
            422,
            r#"files["a/b"]"#.into(),
        ),
        (
            one(json!({"a/./b": "x", "a/b": "y"})),
            422,
            r#"files["a/b"]"#.into(),
        ),
        (
            one(json!({"a": {"base64": "@@@"}})),
            422,
            r#"files["a"].base64"#.into(),
        ),
        (
            one(json!({"a": {"base64": "AA=", "x": 1}})),
            422,
            r#"files["a"]"#.into(),
        ),
        (one(json!({"a": 7})), 422, r#"files["a"]"#.into()),
        (one(json!({"a": null})), 422, r#"files["a"]"#.into()),
        (one(json!(["a"])), 422, "files".into()),
        (
            one(json!({"a": {"base64": "A".repeat(15 * 1024 * 1024)}})),
            413,
            r#"files["a"].base64"#.into(),
        ),
        (
            one(json!({"a": "x".repeat(10 * 1024 * 1024 + 1)})),
            413,
            r#"files["a"]"#.into(),
        ),
        (
            one(json!({"a": "x".repeat(6 * 1024 * 1024), "b": "x".repeat(6 * 1024 * 1024)})),
            413,
            "files".into(),
        ),
        (
            one(json!({"p".repeat(100 * 1024): "x"})),
            422,
            format!("files[\"{}\"]", "p".repeat(64)),
        ),
        (
            one(json!({format!("{}f", "d/".repeat(40)): "x"})),
            422,
            format!(
                "files[\"{}\"]",
                format!("{}f", "d/".repeat(40))
                    .chars()
                    .take(64)
                    .collect::<String>()
            ),
        ),
        (
            one(Value::Object(
                (0..1001).map(|i| (format!("f{i}"), json!(""))).collect(),
            )),
            422,
            "files".into(),
        ),
        (
            one(Value::Object(
                (0..10_001).map(|i| (format!("f{i}"), json!(""))).collect(),
            )),
            422,
            "files".into(),
        ),
        (
            json!({"prompt": "p", "workspace_from": 3}),
            422,
            "workspace_from".into(),
        ),
        (
            json!({"prompt": "p", "workspace_from": ""}),
            422,
            "workspace_from".into(),
        ),
    ];
    for (body, status, want) in &cases {
        let (s, v) = env.post("/v1/sessions", &env.acme, body).await;
        assert_eq!((s, field(&v)), (*status, want.as_str()), "{v}");
        let (s, v) = env
            .post(
                "/v1/sessions/batch",
                &env.acme,
                &json!([{"prompt": "ok"}, body]),
            )
            .await;
        assert_eq!(
            (s, field(&v)),
            (*status, format!("[1].{want}").as_str()),
            "{v}"
        );
    }
    // A NUL in a path is refused before anything is decoded.
    let (s, v) = env
        .post(
            "/v1/sessions",
            &env.acme,
            &json!({"prompt": "p", "files": {"a\u{0}b": "x"}}),
        )
        .await;
    assert_eq!(s, 422, "{v}");
    assert!(field(&v).starts_with("files."), "{v}");
    assert_eq!(env.sessions_of("acme").await, 0);

    // A tenant's own policy: narrower bounds, named the same way.
    let tiny = env.key_of(TINY_TENANT).await;
    for (files, status, want) in [
        (json!({"a": "", "b": "", "c": ""}), 422, "files"),
        (json!({"a": "123456789"}), 413, r#"files["a"]"#),
        (json!({"a/b/c": ""}), 422, r#"files["a/b/c"]"#),
    ] {
        let (s, v) = env.post("/v1/sessions", &tiny, &one(files)).await;
        assert_eq!((s, field(&v)), (status, want), "{v}");
    }
    let (s, v) = env
        .post("/v1/sessions", &tiny, &one(json!({"a/b": "12345678"})))
        .await;
    assert_eq!(s, 201, "{v}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_download_never_leaves_the_tree() {
    let env = Env::start().await;
    let (_, v) = env
        .post(
            "/v1/sessions",
            &env.acme,
            &json!({"prompt": "p", "files": {"in/a.txt": "a"}}),
        )
        .await;
    let id = v["id"].as_str().unwrap().to_string();
    let (s, body) = env
        .raw_get(&format!("/v1/sessions/{id}/files/in/a.txt"), &env.acme)
        .await;
    assert_eq!(s, 200, "{body}");
    for target in [
        "in/../../../../etc/passwd",
        "../../../../etc/passwd",
        "%2e%2e/%2e%2e/etc/passwd",
        "in/%2E%2E/%2E%2E/x",
        "..%2f..%2fetc%2fpasswd",
        "%2Fetc%2Fpasswd",
        "/etc/passwd",
        "in/..%5c..%5cx",
        "in/a.txt%00.png",
        "in//a.txt",
        ".git/config",
        "%ff%fe",
    ] {
        let (s, body) = env
            .raw_get(&format!("/v1/sessions/{id}/files/{target}"), &env.acme)
            .await;
        assert!(s == 404 || s == 422, "{target}: {s} {body}");
        assert!(!body.contains("root:"), "{target}: {body}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_down_refuses_files_in_and_out_and_loses_nothing() {
    let mut pg =
        tokio::task::block_in_place(agentq_testkit::PostgresServer::start_crash_safe).unwrap();
    let db_url = pg.fresh_database().unwrap();
    let store = PgStore::connect(&db_url, 4).await.unwrap();
    store.migrate().await.unwrap();
    let store = Arc::new(store);
    let redis = RedisServer::start().unwrap();
    let queue = Arc::new(RedisQueue::connect(&redis.url()).await.unwrap());
    let mut settings = SchedulerSettings::default();
    settings.auth = settings.auth.with_admin_key("files-fault-admin");
    let state = Scheduler::new(store.clone(), queue, settings);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    let http = reqwest::Client::new();
    let post = |body: Value| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http
                .post(format!("{base}/v1/sessions"))
                .bearer_auth("files-fault-admin")
                .json(&body)
                .send()
                .await
                .unwrap();
            (
                r.status().as_u16(),
                r.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let get = |path: String| {
        let (http, base) = (http.clone(), base.clone());
        async move {
            let r = http
                .get(format!("{base}{path}"))
                .bearer_auth("files-fault-admin")
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.bytes().await.unwrap().to_vec())
        }
    };
    let (s, v) = post(json!({"prompt": "p", "files": {"kept.txt": "kept"}})).await;
    assert_eq!(s, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();

    tokio::task::block_in_place(|| pg.kill());
    let (s, v) = post(json!({"prompt": "lost?", "files": {"a.txt": "a"}})).await;
    assert_eq!(s, 503, "{v}");
    assert_eq!(get(format!("/v1/sessions/{id}/files")).await.0, 503);
    assert_eq!(
        get(format!("/v1/sessions/{id}/files/kept.txt")).await.0,
        503
    );

    tokio::task::block_in_place(|| pg.restart()).unwrap();
    // The refused request left nothing; the committed files are there, byte for byte.
    let body = wait_until(
        "the scheduler to answer again",
        std::time::Duration::from_secs(10),
        || async {
            let (s, body) = get(format!("/v1/sessions/{id}/files/kept.txt")).await;
            if s == 200 { Ok(body) } else { Err(s) }
        },
    )
    .await;
    assert_eq!(body, b"kept");
    let all = store
        .list(&ListFilter {
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(all.len(), 1, "{all:?}");
    let (s, v) = post(json!({"prompt": "again", "files": {"a.txt": "a"}})).await;
    assert_eq!(s, 201, "{v}");
}
