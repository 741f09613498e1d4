//! The cluster every end-to-end test runs: a private Redis, a Postgres database, the fake
//! LLM (which also serves the `http_fetch` tool endpoints), and real `agentq worker`
//! processes the tests start, SIGKILL, SIGTERM, SIGSTOP and SIGCONT.
//!
//! Sessions follow a [`Script`]: the fake answers each LLM request from the request
//! itself — the session by the token in its prompt, the turn by the number of assistant
//! messages in the history sent — so any worker, resuming from any checkpoint, gets the
//! same answer for the same turn. Every LLM request and tool hit is logged as a [`Hit`]
//! so tests can assert what was asked again after a crash.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use agentq_agent::spec::SessionSpec;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::sharded::ShardedStore;
use agentq_core::{EnqueueReason, NewSession, SessionRow, Store, WorkQueue};
use agentq_testkit::{
    FakeLlm, FakeResponse, PostgresServer, RecordedRequest, RedisCluster, RedisServer,
    shared_postgres,
};
use bytes::Bytes;
use futures::StreamExt;
use serde_json::{Value, json};

/// Lease timings of every worker: short, so a dead worker's sessions move within seconds,
/// but with four heartbeats per lease so a busy 2-core box does not lose leases.
pub const LEASE_TTL_SECS: &str = "2";
pub const HEARTBEAT_SECS: &str = "0.5";
pub const RECLAIM_INTERVAL_SECS: &str = "0.5";

/// A tool endpoint told to block answers after this long: far beyond any kill the test
/// makes, and beyond `http_fetch`'s own 30 s timeout.
const BLOCK: Duration = Duration::from_secs(120);

/// The tests of this binary run one at a time: each starts several worker processes with
/// second-scale lease timings, and the box has 2 cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The `agentq` binary, built once per test binary (`CARGO_BIN_EXE_*` only exists for the
/// cli crate's own tests). A workspace-wide `cargo test` (what CI runs) has built it
/// already, from these sources, with the features every test of the workspace unifies:
/// building it again for the cli crate's features alone would rebuild much of the
/// dependency tree (minutes on a 2-core box). So it is used as it is when it is newer than
/// every file of the workspace, and built otherwise.
pub fn agentq_bin() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // `scripts/test` names the binary it has just built: rebuilding it here (a test-only
        // file newer than the unchanged binary looks stale) would replace it under the
        // tests of the other lane that run it.
        if let Some(bin) = std::env::var_os("AGENTQ_TEST_BIN") {
            let bin = PathBuf::from(bin);
            assert!(
                bin.is_file(),
                "AGENTQ_TEST_BIN={} is no file",
                bin.display()
            );
            return bin;
        }
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the testkit lives in the workspace")
            .to_path_buf();
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"));
        let target = if target.is_relative() {
            workspace.join(target)
        } else {
            target
        };
        let bin = target.join("debug").join("agentq");
        let built = std::fs::metadata(&bin).and_then(|m| m.modified()).ok();
        if built.is_none_or(|b| newest_file(&workspace, &target) >= b) {
            let status = Command::new(env!("CARGO"))
                .args(["build", "-p", "agentq-cli", "--bin", "agentq"])
                .current_dir(&workspace)
                .status()
                .expect("running cargo build");
            assert!(status.success(), "cargo build -p agentq-cli failed");
        }
        assert!(bin.is_file(), "{} was not built", bin.display());
        bin
    })
}

/// When the newest file under `dir` was written, leaving out `skip` (the build's own
/// output) and hidden entries (`.git`).
fn newest_file(dir: &Path, skip: &Path) -> std::time::SystemTime {
    let mut newest = std::time::SystemTime::UNIX_EPOCH;
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let path = e.path();
            if path == skip || e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                todo.push(path);
            } else if let Ok(m) = meta.modified() {
                newest = newest.max(m);
            }
        }
    }
    newest
}

// ---------------------------------------------------------------------------------------
// Scripts
// ---------------------------------------------------------------------------------------

/// One `http_fetch` call of a turn: `GET` (idempotent) or `POST` (unsafe) to
/// `/tool/<token>/<name>` on the fake.
#[derive(Debug, Clone)]
pub struct ToolUse {
    pub name: String,
    pub post: bool,
    /// Instead of `http_fetch`: `spawn_agent` for a child playing the script registered
    /// under this token ([`Cluster::register`]), waiting for it or not.
    pub spawn: Option<(String, bool)>,
    /// Instead of `http_fetch`: `read_file` of the path `name` in the session's workspace,
    /// a call that changes nothing (`Pure`).
    pub read: bool,
    /// Instead of all of the above: this tool with these arguments.
    pub call: Option<(String, Value)>,
}

impl ToolUse {
    pub fn spawn(child_token: &str, label: &str, wait: bool) -> ToolUse {
        ToolUse {
            name: label.into(),
            post: false,
            spawn: Some((child_token.into(), wait)),
            read: false,
            call: None,
        }
    }

    /// A call of `tool` with `args`.
    pub fn call(tool: &str, args: Value) -> ToolUse {
        ToolUse {
            name: tool.into(),
            post: false,
            spawn: None,
            read: false,
            call: Some((tool.into(), args)),
        }
    }
}

/// One LLM answer: some text and, unless it is the final answer, tool calls.
#[derive(Debug, Clone)]
pub struct Turn {
    pub text: String,
    pub tools: Vec<ToolUse>,
}

impl Turn {
    pub fn text(text: &str) -> Turn {
        Turn {
            text: text.into(),
            tools: Vec::new(),
        }
    }

    /// A turn calling `http_fetch` with GET on each named endpoint, in parallel.
    pub fn gets(text: &str, names: &[&str]) -> Turn {
        Turn::calls(text, names, false)
    }

    /// A turn calling `read_file` on each named workspace path, in parallel.
    pub fn reads(text: &str, paths: &[&str]) -> Turn {
        Turn::calls(text, paths, true)
    }

    fn calls(text: &str, names: &[&str], read: bool) -> Turn {
        Turn {
            text: text.into(),
            tools: names
                .iter()
                .map(|n| ToolUse {
                    name: n.to_string(),
                    post: false,
                    spawn: None,
                    read,
                    call: None,
                })
                .collect(),
        }
    }
}

/// What the fake does for one session.
#[derive(Debug, Clone, Default)]
pub struct Script {
    pub turns: Vec<Turn>,
    /// Delay before each SSE chunk of every LLM answer.
    pub chunk_delay: Duration,
    /// The first request for turn k streams with this delay before each chunk instead.
    pub slow_once: HashMap<usize, Duration>,
    /// These tool endpoints block their first hit (per session) for [`BLOCK`].
    pub block_tool_once: HashSet<String>,
    /// Every LLM request gets a 500 with a provider error message.
    pub fail_500: bool,
    /// LLM requests for this turn and later get a 500, until [`Cluster::heal`].
    pub fail_from_turn: Option<usize>,
    /// LLM requests are accepted but the stream never delivers anything.
    pub hang: bool,
}

impl Script {
    pub fn new(turns: Vec<Turn>) -> Script {
        Script {
            turns,
            ..Script::default()
        }
    }

    /// Three turns: one tool, two parallel tools, the answer.
    pub fn three_turns() -> Script {
        Script::new(vec![
            Turn::gets("Fetching the first page.", &["t0a"]),
            Turn::gets("Fetching two more, in parallel.", &["fast", "slow"]),
            Turn::text("All done: the pages say ok."),
        ])
    }

    /// Two turns: one tool, the answer.
    pub fn two_turns() -> Script {
        Script::new(vec![
            Turn::gets("Fetching the page.", &["page"]),
            Turn::text("The page says ok."),
        ])
    }
}

/// One request the fake saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hit {
    Llm { token: String, turn: usize },
    Tool { token: String, name: String },
}

/// A submitted session.
#[derive(Debug, Clone)]
pub struct Sub {
    pub id: String,
    /// Unique per session; in its prompt and in its tool URLs.
    pub token: String,
}

struct FakeState {
    url: String,
    scripts: Mutex<HashMap<String, Script>>,
    hits: Mutex<Vec<Hit>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn new_token() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    // Fixed width, so no token is a prefix of another (tests substitute tokens in text).
    format!(
        "tk{:07}x{:06}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// The token between `<<` and `>>` in the first user message of an OpenAI request body.
fn token_of(body: &Value) -> Option<String> {
    let msgs = body.get("messages")?.as_array()?;
    let user = msgs.iter().find(|m| m["role"] == "user")?;
    let text = match &user["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let start = text.find("<<")? + 2;
    let end = start + text[start..].find(">>")?;
    Some(text[start..end].to_string())
}

fn answer(state: &FakeState, req: &RecordedRequest) -> Option<FakeResponse> {
    if let Some(rest) = req.path.strip_prefix("/tool/") {
        let (token, name) = rest.split_once('/')?;
        lock(&state.hits).push(Hit::Tool {
            token: token.into(),
            name: name.into(),
        });
        let block = lock(&state.scripts)
            .get_mut(token)
            .is_some_and(|s| s.block_tool_once.remove(name));
        let resp = FakeResponse::json(
            200,
            json!({"tool": name, "result": format!("ok-{name}")}).to_string(),
        );
        return Some(if block { resp.with_delay(BLOCK) } else { resp });
    }
    if !req.path.ends_with("/chat/completions") {
        return None;
    }
    let token = token_of(&req.body)?;
    let turn = req.body["messages"].as_array().map_or(0, |ms| {
        ms.iter().filter(|m| m["role"] == "assistant").count()
    });
    lock(&state.hits).push(Hit::Llm {
        token: token.clone(),
        turn,
    });
    let mut scripts = lock(&state.scripts);
    let script = scripts.get_mut(&token)?;
    if script.fail_500 || script.fail_from_turn.is_some_and(|k| turn >= k) {
        return Some(FakeResponse::json(
            500,
            r#"{"error":{"message":"upstream exploded (e2e)","type":"server_error"}}"#,
        ));
    }
    let Some(t) = script.turns.get(turn) else {
        return Some(FakeResponse::json(
            400,
            format!(r#"{{"error":{{"message":"e2e script has no turn {turn}"}}}}"#),
        ));
    };
    let chunks = openai_turn(turn, t, &state.url, &token);
    if script.hang {
        return Some(FakeResponse::sse_chunks(chunks).with_delay(Duration::from_secs(600)));
    }
    let delay = script.slow_once.remove(&turn).unwrap_or(script.chunk_delay);
    Some(FakeResponse::sse_chunks(chunks).with_delay(delay))
}

fn openai_chunk(delta: Value, finish: Option<&str>) -> Bytes {
    let v = json!({
        "id": "chatcmpl-e2e", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
    });
    Bytes::from(format!("data: {v}\n\n"))
}

/// One OpenAI streamed answer, one SSE event per chunk: the text in two pieces, each tool
/// call (id `call_<turn>_<k>`) with its arguments split over two chunks, the finish, the
/// usage, `[DONE]`.
pub fn openai_turn(turn: usize, t: &Turn, base_url: &str, token: &str) -> Vec<Bytes> {
    let mut out = vec![openai_chunk(
        json!({"role": "assistant", "content": ""}),
        None,
    )];
    let mid = t.text.len() / 2;
    let (a, b) = t.text.split_at(mid);
    out.push(openai_chunk(json!({"content": a}), None));
    out.push(openai_chunk(json!({"content": b}), None));
    for (k, tool) in t.tools.iter().enumerate() {
        let (function, args) = match &tool.spawn {
            _ if tool.call.is_some() => match &tool.call {
                Some((f, a)) => (f.as_str(), a.clone()),
                None => unreachable!(),
            },
            Some((child, wait)) => (
                "spawn_agent",
                json!({"prompt": format!("Follow the e2e script <<{child}>>."),
                       "label": tool.name, "wait": wait}),
            ),
            None if tool.read => ("read_file", json!({"path": tool.name})),
            None => {
                let mut args = json!({"url": format!("{base_url}/tool/{token}/{}", tool.name)});
                if tool.post {
                    args["method"] = json!("POST");
                }
                ("http_fetch", args)
            }
        };
        let args = args.to_string();
        let (x, y) = args.split_at(args.len() / 2);
        out.push(openai_chunk(
            json!({"tool_calls": [{"index": k, "id": format!("call_{turn}_{k}"), "type": "function",
                "function": {"name": function, "arguments": x}}]}),
            None,
        ));
        out.push(openai_chunk(
            json!({"tool_calls": [{"index": k, "function": {"arguments": y}}]}),
            None,
        ));
    }
    let finish = if t.tools.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    out.push(openai_chunk(json!({}), Some(finish)));
    out.push(Bytes::from(format!(
        "data: {}\n\n",
        json!({"id": "chatcmpl-e2e", "object": "chat.completion.chunk", "choices": [],
            "usage": {"prompt_tokens": 100 + turn, "completion_tokens": 10, "total_tokens": 110 + turn}})
    )));
    out.push(Bytes::from_static(b"data: [DONE]\n\n"));
    out
}

// ---------------------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct WorkerOpts {
    pub concurrency: u32,
    pub reclaim_min_idle_secs: f64,
    pub max_attempts: u32,
    pub drain_timeout_secs: f64,
    /// `--write-ahead-grace-ms`, when set.
    pub write_ahead_grace_ms: Option<u64>,
    /// The OpenAI endpoint instead of the cluster's scripted fake (another fake, such as
    /// a rate-limited one): its base URL without `/v1`.
    pub llm_url: Option<String>,
    /// More variables for the worker's environment (settings such as `[[limits]]`).
    pub env: Vec<(String, String)>,
    /// Its own `--workspace-root` (another machine's disk), else the cluster's.
    pub workspace_root: Option<PathBuf>,
    /// `--workspace-quota-bytes`, when set.
    pub workspace_quota_bytes: Option<u64>,
    /// `--enable-shell`.
    pub enable_shell: bool,
    /// Without `RUST_LOG`: the lines an operator sees by default.
    pub default_log: bool,
}

impl Default for WorkerOpts {
    fn default() -> Self {
        WorkerOpts {
            concurrency: 64,
            reclaim_min_idle_secs: 2.0,
            max_attempts: 5,
            drain_timeout_secs: 15.0,
            write_ahead_grace_ms: None,
            llm_url: None,
            env: Vec::new(),
            workspace_root: None,
            workspace_quota_bytes: None,
            enable_shell: false,
            default_log: false,
        }
    }
}

struct WorkerProc {
    child: Child,
    log: PathBuf,
    exit: Option<ExitStatus>,
}

// ---------------------------------------------------------------------------------------
// The cluster
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, Default)]
pub struct ClusterOpts {
    /// Redis with an fsynced append-only file, for tests that restart it.
    pub persistent_redis: bool,
    /// A private crash-safe Postgres, for tests that kill and restart it.
    pub private_postgres: bool,
    /// Postgres shards beyond the first (each a database on another server; the last a
    /// private crash-safe server with `private_shard`): `database_url` names them all.
    pub extra_shards: usize,
    /// The last extra shard on a private crash-safe server, for tests that stop it.
    pub private_shard: bool,
    /// A 3-master Redis Cluster instead of one Redis (the processes are told
    /// `AGENTQ_REDIS_CLUSTER=true`; each queue in its default 8 partitions).
    pub redis_cluster: bool,
}

impl ClusterOpts {
    /// The scale-out layout: a 3-master Redis Cluster and two Postgres shards (tests that
    /// also run on the default layout run on this one with it).
    pub fn scaled_out() -> ClusterOpts {
        ClusterOpts {
            redis_cluster: true,
            extra_shards: 1,
            ..ClusterOpts::default()
        }
    }

    /// With `AGENTQ_E2E_LAYOUT=scaled-out`, a test that asks for no servers of its own
    /// (a Redis or Postgres it restarts, more shards) runs on the scale-out layout: the
    /// whole suite on a Redis Cluster and two shards, run by hand (CI runs it on the
    /// default layout, and the tests named for the scale-out layout on that).
    fn or_layout_from_env(self) -> ClusterOpts {
        let asks_nothing = !self.persistent_redis
            && !self.private_postgres
            && self.extra_shards == 0
            && !self.redis_cluster;
        let scaled_out = std::env::var("AGENTQ_E2E_LAYOUT").is_ok_and(|v| v == "scaled-out");
        if asks_nothing && scaled_out {
            ClusterOpts::scaled_out()
        } else {
            self
        }
    }
}

pub use agentq_testkit::Redis;

/// A test's own connection to one Redis or to a cluster ([`Cluster::redis_conn`]).
#[derive(Clone)]
pub enum TestConn {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl redis::aio::ConnectionLike for TestConn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        match self {
            TestConn::Single(c) => c.req_packed_command(cmd),
            TestConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        match self {
            TestConn::Single(c) => c.req_packed_commands(cmd, offset, count),
            TestConn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            TestConn::Single(c) => c.get_db(),
            TestConn::Cluster(c) => c.get_db(),
        }
    }
}

pub struct Cluster {
    /// The store the processes use: a `PgStore`, or a `ShardedStore` over the shards.
    pub store: Arc<dyn Store>,
    /// Each shard's own store (one without extra shards).
    pub shards: Vec<PgStore>,
    /// The private server of the last shard (`ClusterOpts::private_shard`).
    pub shard_pg: Option<PostgresServer>,
    pub queue: RedisQueue,
    pub db_url: String,
    pub redis: Redis,
    pub pg: Option<PostgresServer>,
    pub fake: FakeLlm,
    state: Arc<FakeState>,
    workers: Vec<WorkerProc>,
    dir: tempfile::TempDir,
    started: Instant,
    _serial: tokio::sync::MutexGuard<'static, ()>,
}

/// `db_url` and the databases of `opts.extra_shards` more shards, between commas; the
/// last on a private crash-safe server with `opts.private_shard`, returned.
fn with_extra_shards(db_url: String, opts: &ClusterOpts) -> (String, Option<PostgresServer>) {
    let mut urls = vec![db_url];
    let mut private = None;
    for i in 1..=opts.extra_shards {
        let url = if opts.private_shard && i == opts.extra_shards {
            let pg = tokio::task::block_in_place(PostgresServer::start_crash_safe)
                .expect("starting a private postgres shard");
            let url = pg.fresh_database().expect("a database on the shard");
            private = Some(pg);
            url
        } else {
            tokio::task::block_in_place(|| {
                agentq_testkit::migrated_database(
                    agentq_testkit::shared_postgres_shard(i.min(2))
                        .expect("a shared postgres shard"),
                )
                .expect("a migrated database on a shared postgres shard")
            })
        };
        urls.push(url);
    }
    (urls.join(","), private)
}

impl Cluster {
    pub async fn start() -> Cluster {
        Self::start_with(ClusterOpts::default()).await
    }

    pub async fn start_with(opts: ClusterOpts) -> Cluster {
        let opts = opts.or_layout_from_env();
        let serial = SERIAL.lock().await;
        tokio::task::block_in_place(agentq_bin);
        let redis = if opts.redis_cluster {
            let cluster = tokio::task::block_in_place(|| RedisCluster::start_in_memory(3));
            Redis::Cluster(cluster.expect("starting a redis cluster"))
        } else if opts.persistent_redis {
            Redis::Single(RedisServer::start_persistent().expect("starting redis"))
        } else {
            Redis::Single(RedisServer::start().expect("starting redis"))
        };
        let (pg, db_url) = if opts.private_postgres {
            let pg = tokio::task::block_in_place(PostgresServer::start_crash_safe)
                .expect("starting a private postgres");
            let url = pg.fresh_database().expect("creating a database");
            (Some(pg), url)
        } else {
            let url = tokio::task::block_in_place(|| {
                agentq_testkit::migrated_database(shared_postgres().expect("the shared postgres"))
                    .expect("a migrated database on the shared postgres")
            });
            (None, url)
        };
        let (db_url, shard_pg) = with_extra_shards(db_url, &opts);
        let mut shards = Vec::new();
        for url in db_url.split(',') {
            let shard = PgStore::connect(url, 8).await.expect("connecting to pg");
            shard.migrate().await.expect("migrating");
            shards.push(shard);
        }
        let store: Arc<dyn Store> = match shards.as_slice() {
            [one] => Arc::new(one.clone()),
            _ => Arc::new(ShardedStore::new(shards.clone()).expect("shards")),
        };
        let queue = RedisQueue::connect_with(&redis.url(), &redis.settings())
            .await
            .expect("connecting to redis");
        queue.ensure_queue("default").await.expect("ensure_queue");
        let fake = FakeLlm::start().await.expect("starting the fake LLM");
        let state = Arc::new(FakeState {
            url: fake.url.clone(),
            scripts: Mutex::new(HashMap::new()),
            hits: Mutex::new(Vec::new()),
        });
        let s = state.clone();
        fake.set_handler(move |req| answer(&s, req));
        Cluster {
            store,
            shards,
            shard_pg,
            queue,
            db_url,
            redis,
            pg,
            fake,
            state,
            workers: Vec::new(),
            dir: tempfile::tempdir().expect("a temp dir"),
            started: Instant::now(),
            _serial: serial,
        }
    }

    /// A store of its own over the cluster's database (each shard's), as another process
    /// (a scheduler beside the workers) opens it.
    pub async fn open_store(&self, pool: u32) -> Arc<dyn Store> {
        self.open_store_with(pool, |shard| shard).await
    }

    /// [`Cluster::open_store`], each shard's store made by `each` from its plain one (a
    /// blob store beside it, say).
    pub async fn open_store_with(
        &self,
        pool: u32,
        each: impl Fn(PgStore) -> PgStore,
    ) -> Arc<dyn Store> {
        let mut shards = Vec::new();
        for url in self.db_url.split(',') {
            shards.push(each(
                PgStore::connect(url, pool).await.expect("connecting to pg"),
            ));
        }
        match shards.as_slice() {
            [one] => Arc::new(one.clone()),
            _ => Arc::new(ShardedStore::new(shards).expect("shards")),
        }
    }

    /// The control shard's URL (the only one without extra shards).
    pub fn control_db_url(&self) -> &str {
        self.db_url.split(',').next().unwrap_or(&self.db_url)
    }

    // --- workers -----------------------------------------------------------------------

    /// Start a worker process; returns its index. Its stderr and stdout go to a log file.
    pub fn spawn_worker(&mut self, opts: &WorkerOpts) -> usize {
        let i = self.workers.len();
        let log = self.dir.path().join(format!("worker-{i}.log"));
        let out = File::create(&log).expect("creating a worker log");
        let err = out.try_clone().expect("cloning a file handle");
        let host = self
            .fake
            .url
            .strip_prefix("http://")
            .expect("the fake serves http")
            .to_string();
        let mut cmd = Command::new(agentq_bin());
        cmd.arg("worker")
            .args(["--database-url", &self.db_url])
            .args(["--redis-url", &self.redis.url()])
            .env(
                "AGENTQ_REDIS_CLUSTER",
                self.redis.settings().cluster.to_string(),
            )
            .args(["--concurrency", &opts.concurrency.to_string()])
            .args(["--lease-ttl-secs", LEASE_TTL_SECS])
            .args(["--heartbeat-secs", HEARTBEAT_SECS])
            .args([
                "--reclaim-min-idle-secs",
                &opts.reclaim_min_idle_secs.to_string(),
            ])
            .args(["--reclaim-interval-secs", RECLAIM_INTERVAL_SECS])
            .args(["--max-attempts", &opts.max_attempts.to_string()])
            .args(["--drain-timeout-secs", &opts.drain_timeout_secs.to_string()])
            .arg("--workspace-root")
            .arg(
                opts.workspace_root
                    .clone()
                    .unwrap_or_else(|| self.dir.path().join("ws")),
            )
            .args([
                "--default-provider",
                "openai",
                "--default-model",
                "gpt-test",
            ])
            .args(["--allowed-hosts", &host])
            .env("OPENAI_BASE_URL", format!("{}/v1", self.fake.url))
            .env("OPENAI_API_KEY", "sk-e2e")
            // The scripts fetch from the fake (the default policy allows reads only).
            .env(
                "AGENTQ_POLICY_TOOLS",
                "read_file,list_dir,glob,grep,spawn_agent,http_fetch,write_file,shell",
            )
            .env("RUST_LOG", "info")
            // Several workers run side by side: no fixed metrics port to fight over.
            .env("AGENTQ_METRICS_ADDR", "127.0.0.1:0")
            // Plain log lines to search.
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        if let Some(url) = &opts.llm_url {
            cmd.env("OPENAI_BASE_URL", format!("{url}/v1"));
        }
        cmd.envs(opts.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if opts.enable_shell {
            cmd.arg("--enable-shell");
        }
        if opts.default_log {
            cmd.env_remove("RUST_LOG");
        }
        if let Some(n) = opts.workspace_quota_bytes {
            // A file may not be larger than the whole quota.
            cmd.args(["--workspace-quota-bytes", &n.to_string()])
                .args(["--max-file-bytes", &n.to_string()]);
        }
        if let Some(ms) = opts.write_ahead_grace_ms {
            cmd.args(["--write-ahead-grace-ms", &ms.to_string()]);
        }
        let child = cmd.spawn().expect("spawning agentq worker");
        self.workers.push(WorkerProc {
            child,
            log,
            exit: None,
        });
        i
    }

    /// Start a worker and wait until it reads the queue.
    pub async fn spawn_ready_worker(&mut self, opts: &WorkerOpts) -> usize {
        let i = self.spawn_worker(opts);
        self.wait_log(i, "worker started", Duration::from_secs(30))
            .await;
        i
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.workers[i].child.id()
    }

    fn signal(&self, i: usize, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid(i).to_string())
            .status()
            .expect("running kill");
        assert!(status.success(), "kill -{sig} worker {i} failed");
    }

    /// SIGKILL, and reap.
    pub fn kill_worker(&mut self, i: usize) {
        let w = &mut self.workers[i];
        let _ = w.child.kill();
        w.exit = Some(w.child.wait().expect("reaping a worker"));
    }

    /// SIGTERM: a graceful drain.
    pub fn term_worker(&self, i: usize) {
        self.signal(i, "TERM");
    }

    /// SIGSTOP: the process freezes (a GC pause, a stalled VM).
    pub fn pause_worker(&self, i: usize) {
        self.signal(i, "STOP");
    }

    /// SIGCONT.
    pub fn resume_worker(&self, i: usize) {
        self.signal(i, "CONT");
    }

    /// Wait for the worker to exit; `None` if it is still running after `timeout`.
    pub async fn wait_exit(&mut self, i: usize, timeout: Duration) -> Option<ExitStatus> {
        let w = &mut self.workers[i];
        poll(POLL, timeout, async || {
            if w.exit.is_none() {
                w.exit = w.child.try_wait().expect("try_wait");
            }
            w.exit.is_some()
        })
        .await;
        w.exit
    }

    pub fn worker_log(&self, i: usize) -> String {
        std::fs::read_to_string(&self.workers[i].log).unwrap_or_default()
    }

    pub async fn wait_log(&self, i: usize, needle: &str, timeout: Duration) {
        assert!(
            self.log_appears(i, needle, timeout).await,
            "worker {i} did not log {needle:?} within {timeout:?}"
        );
    }

    /// Whether worker `i` logs `needle` within `timeout`.
    pub async fn log_appears(&self, i: usize, needle: &str, timeout: Duration) -> bool {
        poll(POLL, timeout, async || self.worker_log(i).contains(needle)).await
    }

    // --- sessions ----------------------------------------------------------------------

    /// Make `script` playable by a session whose task names the returned token (a
    /// sub-agent), without creating a session.
    pub fn register(&self, script: Script) -> String {
        let token = new_token();
        lock(&self.state.scripts).insert(token.clone(), script);
        token
    }

    /// The next hit of `sub`'s tool endpoint `name` blocks (as [`Script::block_tool_once`]).
    pub fn block_tool_once(&self, sub: &Sub, name: &str) {
        if let Some(s) = lock(&self.state.scripts).get_mut(&sub.token) {
            s.block_tool_once.insert(name.into());
        }
    }

    /// The model answers the session playing `token` again (no more 500s).
    pub fn heal(&self, token: &str) {
        if let Some(s) = lock(&self.state.scripts).get_mut(token) {
            s.fail_500 = false;
            s.fail_from_turn = None;
        }
    }

    /// A root session that may spawn sub-agents (and fetch).
    pub async fn submit_spawner(&self, script: Script) -> Sub {
        let token = self.register(script);
        let mut spec = SessionSpec::new(format!("Follow the e2e script <<{token}>>."));
        spec.tools = Some(vec!["http_fetch".into(), "spawn_agent".into()]);
        spec.retry_delay_ms = 50;
        let (row, _) = self
            .store
            .create_session(&NewSession::root(spec, "default"))
            .await
            .expect("creating a session");
        self.queue
            .enqueue("default", &row.id, EnqueueReason::New)
            .await
            .expect("enqueueing");
        self.store
            .mark_enqueued(std::slice::from_ref(&row.id))
            .await
            .expect("mark_enqueued");
        Sub { id: row.id, token }
    }

    /// The worker (index) holding `id`'s lease, if any.
    pub async fn lease_holder(&self, id: &str) -> Option<usize> {
        let owner = self.row(id).await.lease_owner?;
        (0..self.workers.len()).find(|&i| {
            self.workers[i].exit.is_none() && owner.contains(&format!("-{}-", self.pid(i)))
        })
    }

    /// The children of a session.
    pub async fn children(&self, id: &str) -> Vec<SessionRow> {
        self.store
            .list(&agentq_core::ListFilter {
                parent_id: Some(id.to_string()),
                limit: 1000,
                ..Default::default()
            })
            .await
            .expect("listing children")
    }

    /// A root session with these tools and input files.
    pub async fn submit_with_files(
        &self,
        script: Script,
        tools: &[&str],
        files: Vec<agentq_core::workspace::InputFile>,
    ) -> Sub {
        let token = self.register(script);
        let mut spec = SessionSpec::new(format!("Follow the e2e script <<{token}>>."));
        spec.tools = Some(tools.iter().map(|t| t.to_string()).collect());
        spec.retry_delay_ms = 50;
        let mut new = NewSession::root(spec, "default");
        new.files = files;
        let (row, _) = self
            .store
            .create_session(&new)
            .await
            .expect("creating a session");
        self.queue
            .enqueue("default", &row.id, EnqueueReason::New)
            .await
            .expect("enqueueing");
        self.store
            .mark_enqueued(std::slice::from_ref(&row.id))
            .await
            .expect("mark_enqueued");
        Sub { id: row.id, token }
    }

    /// The bodies of the LLM requests of `sub`'s session asking for turn `turn`.
    pub fn llm_bodies(&self, sub: &Sub, turn: usize) -> Vec<String> {
        self.fake
            .requests()
            .into_iter()
            .filter(|r| r.path.ends_with("/chat/completions"))
            .filter(|r| token_of(&r.body).as_deref() == Some(sub.token.as_str()))
            .filter(|r| {
                r.body["messages"].as_array().map_or(0, |ms| {
                    ms.iter().filter(|m| m["role"] == "assistant").count()
                }) == turn
            })
            .map(|r| r.body.to_string())
            .collect()
    }

    /// A directory of the cluster's, for a worker's own workspaces.
    pub fn dir(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub async fn submit(&self, script: Script) -> Sub {
        self.submit_many(vec![script]).await.remove(0)
    }

    /// Create sessions of these specs in one transaction and enqueue them in one round
    /// trip (for fakes other than the scripted one); returns their ids.
    pub async fn submit_specs(&self, specs: Vec<SessionSpec>) -> Vec<String> {
        let news: Vec<NewSession> = specs
            .into_iter()
            .map(|spec| NewSession::root(spec, "default"))
            .collect();
        let rows = self
            .store
            .create_sessions(&news)
            .await
            .expect("creating sessions");
        let ids: Vec<String> = rows.into_iter().map(|(r, _)| r.id).collect();
        let items: Vec<(String, EnqueueReason)> = ids
            .iter()
            .map(|id| (id.clone(), EnqueueReason::New))
            .collect();
        self.queue
            .enqueue_many("default", &items)
            .await
            .expect("enqueueing");
        self.store.mark_enqueued(&ids).await.expect("mark_enqueued");
        ids
    }

    /// Create the sessions in one transaction and enqueue them in one round trip.
    pub async fn submit_many(&self, scripts: Vec<Script>) -> Vec<Sub> {
        let mut news = Vec::new();
        let mut tokens = Vec::new();
        for script in scripts {
            let token = new_token();
            lock(&self.state.scripts).insert(token.clone(), script);
            let mut spec = SessionSpec::new(format!("Follow the e2e script <<{token}>>."));
            spec.tools = Some(vec!["http_fetch".into(), "read_file".into()]);
            spec.retry_delay_ms = 50;
            news.push(NewSession::root(spec, "default"));
            tokens.push(token);
        }
        let rows = self
            .store
            .create_sessions(&news)
            .await
            .expect("creating sessions");
        let ids: Vec<String> = rows.into_iter().map(|(r, _)| r.id).collect();
        let items: Vec<(String, EnqueueReason)> = ids
            .iter()
            .map(|id| (id.clone(), EnqueueReason::New))
            .collect();
        self.queue
            .enqueue_many("default", &items)
            .await
            .expect("enqueueing");
        self.store.mark_enqueued(&ids).await.expect("mark_enqueued");
        ids.into_iter()
            .zip(tokens)
            .map(|(id, token)| Sub { id, token })
            .collect()
    }

    pub async fn row(&self, id: &str) -> SessionRow {
        self.store
            .get(id)
            .await
            .expect("reading a session")
            .expect("the session exists")
    }

    /// The stored history as (role, content, tool_calls, tool_call_id, is_error), with the
    /// session's token replaced so that transcripts of different sessions compare.
    ///
    /// Parallel tool results are stored in the order they finished, which varies from run
    /// to run; like a resumed session (`SessionState::normalize`), the transcript puts
    /// each turn's results in call order.
    pub async fn transcript(&self, sub: &Sub) -> Vec<Value> {
        let mut msgs = self
            .store
            .messages(&sub.id)
            .await
            .expect("reading messages");
        let mut i = 0;
        while i < msgs.len() {
            let order: Vec<String> = msgs[i].tool_calls.iter().map(|c| c.id.clone()).collect();
            let end = msgs[i + 1..]
                .iter()
                .position(|m| m.role != agentq_agent::schema::Role::Tool)
                .map_or(msgs.len(), |p| i + 1 + p);
            if !order.is_empty() {
                msgs[i + 1..end].sort_by_key(|m| {
                    m.tool_call_id
                        .as_ref()
                        .and_then(|id| order.iter().position(|o| o == id))
                        .unwrap_or(usize::MAX)
                });
            }
            i = end.max(i + 1);
        }
        msgs.iter()
            .map(|m| {
                let v = json!({
                    "role": m.role, "content": m.content, "tool_calls": m.tool_calls,
                    "tool_call_id": m.tool_call_id, "is_error": m.is_error,
                });
                serde_json::from_str(&v.to_string().replace(&sub.token, "<TOKEN>"))
                    .expect("re-parsing a transcript entry")
            })
            .collect()
    }

    /// The workspace directory of the session tree `root_id` (made on its first write).
    pub fn workspace(&self, root_id: &str) -> PathBuf {
        self.dir.path().join("ws").join(root_id)
    }

    pub async fn message_count(&self, id: &str) -> usize {
        self.store
            .messages(id)
            .await
            .expect("reading messages")
            .len()
    }

    /// Poll until every session is terminal; panics with a status summary on timeout.
    /// Polled, not waited for on the completions: the tests restart Redis, and a message
    /// published while a subscriber reconnects is lost.
    pub async fn wait_all_terminal(&self, ids: &[String], timeout: Duration) -> Vec<SessionRow> {
        let mut rows = Vec::with_capacity(ids.len());
        let ended = poll(Duration::from_millis(100), timeout, async || {
            rows.clear();
            for id in ids {
                // A restarting Postgres answers errors for a while: retry.
                match self.store.get(id).await {
                    Ok(Some(r)) => rows.push(r),
                    Ok(None) => panic!("session {id} vanished"),
                    Err(_) => return false,
                }
            }
            rows.iter().all(|r| r.status.is_terminal())
        })
        .await;
        if !ended {
            let mut by_status: HashMap<String, usize> = HashMap::new();
            for r in &rows {
                *by_status.entry(r.status.to_string()).or_default() += 1;
            }
            panic!(
                "{} sessions not all terminal within {timeout:?}: {by_status:?}",
                ids.len()
            );
        }
        rows
    }

    // --- what the fake saw -------------------------------------------------------------

    pub fn hits(&self) -> Vec<Hit> {
        lock(&self.state.hits).clone()
    }

    /// LLM requests for this session's turn.
    pub fn llm_requests(&self, sub: &Sub, turn: usize) -> usize {
        lock(&self.state.hits)
            .iter()
            .filter(
                |h| matches!(h, Hit::Llm { token, turn: t } if *token == sub.token && *t == turn),
            )
            .count()
    }

    /// LLM requests for this session, all turns.
    pub fn llm_requests_all(&self, sub: &Sub) -> usize {
        lock(&self.state.hits)
            .iter()
            .filter(|h| matches!(h, Hit::Llm { token, .. } if *token == sub.token))
            .count()
    }

    /// Hits of this session's tool endpoint `name`.
    pub fn tool_hits(&self, sub: &Sub, name: &str) -> usize {
        lock(&self.state.hits)
            .iter()
            .filter(
                |h| matches!(h, Hit::Tool { token, name: n } if *token == sub.token && n == name),
            )
            .count()
    }

    // --- redis -------------------------------------------------------------------------

    /// A connection of the test's own to the processes' Redis: the server's, or the
    /// cluster's, which sends each command to the node that holds its key.
    pub async fn redis_conn(&self) -> TestConn {
        match &self.redis {
            Redis::Single(server) => TestConn::Single(
                redis::Client::open(server.url())
                    .expect("a redis client")
                    .get_multiplexed_async_connection()
                    .await
                    .expect("connecting to redis"),
            ),
            Redis::Cluster(_) => TestConn::Cluster(
                redis::cluster::ClusterClient::new(self.redis.node_urls())
                    .expect("a cluster client")
                    .get_async_connection()
                    .await
                    .expect("connecting to the cluster"),
            ),
        }
    }

    /// `CLIENT PAUSE <ms> WRITE` (or, with `ms` `None`, `CLIENT UNPAUSE`) on the server,
    /// or on every node of the cluster.
    pub async fn pause_writes(&self, ms: Option<u64>) {
        for url in self.redis.node_urls() {
            let mut conn = redis::Client::open(url)
                .expect("a redis client")
                .get_multiplexed_async_connection()
                .await
                .expect("connecting to a redis node");
            let mut cmd = redis::cmd("CLIENT");
            match ms {
                Some(ms) => cmd.arg("PAUSE").arg(ms).arg("WRITE"),
                None => cmd.arg("UNPAUSE"),
            };
            let () = cmd.query_async(&mut conn).await.expect("CLIENT PAUSE");
        }
    }

    /// Every dead letter of queue `default`, from each of its partitions' streams.
    pub async fn dead_letters(&self) -> Vec<(String, HashMap<String, String>)> {
        let mut all = Vec::new();
        for stream in self.queue.dead_letter_keys("default") {
            all.extend(self.stream_entries(&stream).await);
        }
        all
    }

    /// A queue of its own on the cluster's Redis, as another process opens it.
    pub async fn open_queue(&self) -> RedisQueue {
        RedisQueue::connect_with(&self.redis.url(), &self.redis.settings())
            .await
            .expect("connecting to redis")
    }

    /// Every entry of a stream, as (entry id, fields).
    pub async fn stream_entries(&self, stream: &str) -> Vec<(String, HashMap<String, String>)> {
        let mut conn = self.redis_conn().await;
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(stream)
            .arg("-")
            .arg("+")
            .query_async(&mut conn)
            .await
            .expect("XRANGE");
        reply
            .ids
            .into_iter()
            .map(|e| {
                let fields = e
                    .map
                    .iter()
                    .filter_map(|(k, v)| {
                        redis::from_redis_value_ref::<String>(v)
                            .ok()
                            .map(|v| (k.clone(), v))
                    })
                    .collect();
                (e.id, fields)
            })
            .collect()
    }

    /// Entries of `agentq:completions` per session id.
    pub async fn completion_entries(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for (_, f) in self
            .stream_entries(agentq_core::queue::COMPLETIONS_STREAM)
            .await
        {
            if let Some(id) = f.get("session_id") {
                *counts.entry(id.clone()).or_default() += 1;
            }
        }
        counts
    }

    /// Subscribe to `agentq:done` (subscribed when this returns) and count the messages
    /// per session id from then on.
    pub async fn count_done_messages(&self) -> Arc<Mutex<HashMap<String, usize>>> {
        let counts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let client = redis::Client::open(self.redis.publish_url()).expect("a redis client");
        let mut pubsub = client
            .get_async_pubsub()
            .await
            .expect("a pubsub connection");
        pubsub
            .subscribe(agentq_core::queue::DONE_CHANNEL)
            .await
            .expect("SUBSCRIBE agentq:done");
        let c = counts.clone();
        tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(msg) = messages.next().await {
                let Ok(payload) = msg.get_payload::<String>() else {
                    continue;
                };
                let Ok(v) = serde_json::from_str::<Value>(&payload) else {
                    continue;
                };
                if let Some(id) = v["session_id"].as_str() {
                    *lock(&c).entry(id.to_string()).or_default() += 1;
                }
            }
        });
        counts
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        eprintln!(
            "[e2e] {} ran for {:?}",
            std::thread::current().name().unwrap_or("?"),
            self.started.elapsed()
        );
        for w in &mut self.workers {
            if w.exit.is_none() && matches!(w.child.try_wait(), Ok(None)) {
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
        }
        if std::thread::panicking() {
            for (i, w) in self.workers.iter().enumerate() {
                let log = std::fs::read_to_string(&w.log).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                // What went wrong early (a lost lease, a retried call) is past the tail.
                let warned: Vec<&str> = lines
                    .iter()
                    .copied()
                    .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
                    .take(200)
                    .collect();
                eprintln!(
                    "----- worker {i} warnings and errors ({}) -----\n{}",
                    w.log.display(),
                    warned.join("\n")
                );
                let tail = lines[lines.len().saturating_sub(60)..].join("\n");
                eprintln!(
                    "----- worker {i} log tail ({}) -----\n{tail}",
                    w.log.display()
                );
            }
            eprintln!("----- redis log tail -----\n{}", self.redis.log_tail());
            if let Some(pg) = &self.pg {
                eprintln!("----- postgres log tail -----\n{}", pg.log_tail());
            }
        }
    }
}

/// How often [`eventually`] and the cluster's own waits look again.
pub const POLL: Duration = Duration::from_millis(10);

/// Check `cond` every `every` until it holds or `timeout` passes; whether it held. The
/// one polling loop of these tests, for what announces nothing (a row, a log line, a
/// process's exit, a stream's length).
pub async fn poll(every: Duration, timeout: Duration, mut cond: impl AsyncFnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if cond().await {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

/// Poll `cond` every 10 ms until it holds; panic naming `what` after `timeout`.
pub async fn eventually(what: &str, timeout: Duration, cond: impl AsyncFnMut() -> bool) {
    assert!(
        poll(POLL, timeout, cond).await,
        "timed out after {timeout:?} waiting for: {what}"
    );
}
