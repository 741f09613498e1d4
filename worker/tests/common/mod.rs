//! What the worker's integration tests share: a fresh database on the shared private
//! Postgres and a private Redis with the default queue; workers run in the background; a
//! cluster of them behind the scheduler's API; and the waits. A session's end is waited
//! for on its completion (the pub/sub message a worker publishes when it settles it),
//! anything else that announces nothing by a bounded poll ([`wait_until`]). Each test
//! binary uses a part of this.
#![allow(dead_code)]

use std::collections::HashSet;
use std::fmt::{Debug, Display};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use agentq_agent::spec::SessionSpec;
use agentq_core::budget::BudgetStore;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::{
    EnqueueReason, ListFilter, NewSession, SessionRow, SessionStatus, SessionStore, Signals,
    SweepStore, WorkQueue,
};
use agentq_scheduler::{SchedulerSettings, run as run_scheduler};
use agentq_testkit::{RedisServer, shared_postgres};
use agentq_worker::{Worker, WorkerSettings};

/// A migrated fresh database and a private Redis with the `default` queue; the server
/// lives as long as the returned handle.
pub async fn setup() -> (Arc<PgStore>, Arc<RedisQueue>, RedisServer) {
    let url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
    let store = PgStore::connect(&url, 8).await.unwrap();
    store.migrate().await.unwrap();
    let redis = RedisServer::start().unwrap();
    let queue = RedisQueue::connect(&redis.url()).await.unwrap();
    queue.ensure_queue("default").await.unwrap();
    (Arc::new(store), Arc::new(queue), redis)
}

// --- waits ------------------------------------------------------------------------------

/// What a check of [`wait_until`] found: ready with a value, or not yet (with what it saw,
/// for the message if the wait runs out).
pub trait Ready {
    type Output;
    fn ready(self) -> Result<Self::Output, String>;
}

impl Ready for bool {
    type Output = ();
    fn ready(self) -> Result<(), String> {
        if self { Ok(()) } else { Err("not yet".into()) }
    }
}

impl<T> Ready for Option<T> {
    type Output = T;
    fn ready(self) -> Result<T, String> {
        self.ok_or_else(|| "nothing yet".into())
    }
}

impl<T, E: Debug> Ready for Result<T, E> {
    type Output = T;
    fn ready(self) -> Result<T, String> {
        self.map_err(|seen| format!("{seen:?}"))
    }
}

/// Poll `check` until it is [`Ready`], for a state that announces nothing; panics naming
/// `what` and the last thing seen if `limit` passes first. Checks often at first, then
/// every 100 ms.
pub async fn wait_until<R: Ready, F: Future<Output = R>>(
    what: impl Display,
    limit: Duration,
    mut check: impl FnMut() -> F,
) -> R::Output {
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_millis(10);
    loop {
        match check().await.ready() {
            Ok(v) => return v,
            Err(seen) => assert!(
                Instant::now() < deadline,
                "timed out after {limit:?} waiting for {what}; last seen: {seen}"
            ),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Wait until every session of `ids` has ended, on their completions: subscribed first,
/// then the rows read, so that one which ended before is not waited for. Their rows, in
/// the order of `ids`; panics naming those still running after `limit`.
pub async fn wait_terminal(
    store: &PgStore,
    queue: &RedisQueue,
    ids: &[String],
    limit: Duration,
) -> Vec<SessionRow> {
    let deadline = Instant::now() + limit;
    let mut subs = Vec::with_capacity(ids.len());
    for id in ids {
        subs.push(queue.subscribe_completion(id).await.unwrap());
    }
    let mut done = futures::stream::select_all(subs);
    let mut open = HashSet::new();
    for id in ids {
        if !row(store, id).await.status.is_terminal() {
            open.insert(id.clone());
        }
    }
    while !open.is_empty() {
        match tokio::time::timeout_at(deadline, done.next()).await {
            Ok(Some(c)) if c.status.is_terminal() => {
                open.remove(&c.session_id);
            }
            Ok(Some(_)) => {}
            Ok(None) => panic!("the completion subscriptions ended"),
            Err(_) => {
                let mut still = Vec::new();
                for id in &open {
                    still.push(row(store, id).await);
                }
                panic!(
                    "{} of {} sessions did not end within {limit:?}: {still:#?}",
                    open.len(),
                    ids.len()
                );
            }
        }
    }
    let mut rows = Vec::with_capacity(ids.len());
    for id in ids {
        rows.push(row(store, id).await);
    }
    rows
}

/// Wait until session `id` is in one of `want` (polled: only its end is announced).
pub async fn wait_status(
    store: &PgStore,
    id: &str,
    want: &[SessionStatus],
    limit: Duration,
) -> SessionRow {
    wait_until(
        format_args!("session {id} to be {want:?}"),
        limit,
        || async {
            let r = row(store, id).await;
            if want.contains(&r.status) {
                Ok(r)
            } else {
                Err(r)
            }
        },
    )
    .await
}

pub async fn row(store: &PgStore, id: &str) -> SessionRow {
    store.get(id).await.unwrap().unwrap()
}

// --- workers ------------------------------------------------------------------------------

/// A worker running in the background until [`Running::stop`].
pub struct Running {
    pub worker: Worker,
    stop: CancellationToken,
    handle: tokio::task::JoinHandle<agentq_worker::Result<agentq_worker::Drain>>,
}

/// Start a worker with `cfg` in the background.
pub fn start(store: &Arc<PgStore>, queue: &Arc<RedisQueue>, cfg: WorkerSettings) -> Running {
    let worker = Worker::new(store.clone(), queue.clone(), cfg);
    let stop = CancellationToken::new();
    let handle = tokio::spawn({
        let w = worker.clone();
        let s = stop.clone();
        async move { w.run(s).await }
    });
    Running {
        worker,
        stop,
        handle,
    }
}

impl Running {
    /// Stop it and wait (20 s at most) for it to end cleanly.
    pub async fn stop(self) -> Worker {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(20), self.handle)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        self.worker
    }
}

/// Put a new root session of `spec` on the default queue.
pub async fn submit(store: &PgStore, queue: &RedisQueue, spec: SessionSpec) -> String {
    let (row, _) = store
        .create_session(&NewSession::root(spec, "default"))
        .await
        .unwrap();
    queue
        .enqueue("default", &row.id, EnqueueReason::New)
        .await
        .unwrap();
    row.id
}

/// The queue entry of `session_id`, read as `consumer` (the consumer a worker would read
/// it as), to hand to `Worker::process`.
pub async fn read_entry(
    queue: &RedisQueue,
    consumer: &str,
    session_id: &str,
) -> agentq_core::queue::Delivery {
    let ds = queue
        .read(
            &["default".to_string()],
            consumer,
            10,
            Duration::from_millis(500),
        )
        .await
        .unwrap();
    ds.into_iter()
        .find(|d| d.session_id == session_id)
        .expect("the session's entry")
}

/// Run the sessions `ids` (already queued) on a worker with `cfg` until each has ended;
/// their rows, with the worker stopped again.
pub async fn run_to_end(
    store: &Arc<PgStore>,
    queue: &Arc<RedisQueue>,
    cfg: WorkerSettings,
    ids: &[String],
    limit: Duration,
) -> (Vec<SessionRow>, Worker) {
    let running = start(store, queue, cfg);
    let rows = wait_terminal(store, queue, ids, limit).await;
    (rows, running.stop().await)
}

/// Run one session of `spec` on a worker with `cfg` until it has ended; its row, with the
/// worker stopped again.
pub async fn run_one(
    store: &Arc<PgStore>,
    queue: &Arc<RedisQueue>,
    cfg: WorkerSettings,
    spec: SessionSpec,
) -> (SessionRow, Worker) {
    let id = submit(store, queue, spec).await;
    let (mut rows, worker) = run_to_end(store, queue, cfg, &[id], Duration::from_secs(30)).await;
    (rows.remove(0), worker)
}

// --- a cluster ------------------------------------------------------------------------------

/// The scheduler's operator key in a [`Cluster`]: its API calls read every tenant.
pub const ADMIN_KEY: &str = "cluster-admin-key";
/// The tenant of every root session a [`Cluster`] submits; children must inherit it.
pub const TENANT: &str = "acme";

/// A worker on a thread and runtime of its own.
pub struct WorkerProcess {
    crash: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl WorkerProcess {
    /// Drop its runtime wherever its tasks are, and wait until it has.
    async fn crash(self) {
        let WorkerProcess { crash, thread } = self;
        let _ = crash.send(());
        join(thread, Duration::from_secs(20)).await;
    }

    /// Wait (at most `limit`) for it to end by itself (the cluster stopped).
    async fn join(self, limit: Duration) {
        join(self.thread, limit).await;
    }
}

async fn join(thread: std::thread::JoinHandle<()>, limit: Duration) {
    let _ = tokio::time::timeout(limit, tokio::task::spawn_blocking(move || thread.join())).await;
}

/// Workers, each with its own pool as a separate process has, behind the scheduler (its
/// sweeper and routes), all playing `script` on the scripted provider.
pub struct Cluster {
    pub url: String,
    pub script: Value,
    pub store: Arc<PgStore>,
    pub queue: Arc<RedisQueue>,
    pub api: String,
    pub http: reqwest::Client,
    pub stop: CancellationToken,
    pub workers: Vec<WorkerProcess>,
    concurrency: usize,
    pub redis: Redis,
    dir: tempfile::TempDir,
}

pub use agentq_testkit::Redis;

impl Cluster {
    /// `workers` workers of `concurrency` slots each, their settings changed by `tweak`
    /// (which also gives the scheduler its budgets and prices, as the same file would).
    pub async fn start(
        script: Value,
        workers: usize,
        concurrency: usize,
        tweak: impl Fn(&mut WorkerSettings),
    ) -> Cluster {
        let redis = Redis::Single(RedisServer::start().unwrap());
        Self::start_on(redis, &["default"], script, workers, concurrency, tweak).await
    }

    /// [`Cluster::start`] on `redis`, the scheduler serving `queues`.
    pub async fn start_on(
        redis: Redis,
        queues: &[&str],
        script: Value,
        workers: usize,
        concurrency: usize,
        tweak: impl Fn(&mut WorkerSettings),
    ) -> Cluster {
        let url = agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
        let store = PgStore::connect(&url, 8).await.unwrap();
        store.migrate().await.unwrap();
        let store = Arc::new(store);
        let queue = Arc::new(
            RedisQueue::connect_with(&redis.url(), &redis.settings())
                .await
                .unwrap(),
        );
        for q in queues {
            queue.ensure_queue(q).await.unwrap();
        }
        let stop = CancellationToken::new();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api = format!("http://{}", listener.local_addr().unwrap());
        let mut settings = SchedulerSettings {
            sweep_interval: Duration::from_millis(200),
            sweep_age: Duration::from_millis(500),
            queues: queues.iter().map(|q| q.to_string()).collect(),
            ..Default::default()
        };
        settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
        let mut probe = WorkerSettings::default();
        tweak(&mut probe);
        settings.budgets = probe.budgets.clone();
        settings.prices = probe.prices.clone();
        tokio::spawn(run_scheduler(
            store.clone(),
            queue.clone(),
            settings,
            listener,
            None,
            stop.clone(),
        ));
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {ADMIN_KEY}").parse().unwrap(),
        );
        let mut c = Cluster {
            url,
            script,
            store,
            queue,
            api,
            http: reqwest::Client::builder()
                .default_headers(headers)
                .build()
                .unwrap(),
            stop,
            workers: Vec::new(),
            concurrency,
            redis,
            dir: tempfile::tempdir().unwrap(),
        };
        for i in 0..workers {
            let w = c.start_worker(i, &tweak).await;
            c.workers.push(w);
        }
        c
    }

    /// Worker `i` (its consumer name starts `w<i>-`), stopped by the cluster's token, or
    /// crashed by [`Cluster::crash_and_replace`]. It runs on a runtime of its own, with its
    /// own connections, as a process would: aborting only its `run` task would leave its
    /// heartbeats, reclaimer and sessions running, a zombie beside its replacement.
    async fn start_worker(&self, i: usize, tweak: &impl Fn(&mut WorkerSettings)) -> WorkerProcess {
        let consumer = format!("w{i}-{}", agentq_core::new_session_id());
        let mut cfg = WorkerSettings {
            // Its own directory, as another process would have its own workspace caches.
            workspace_root: self.dir.path().join(&consumer),
            consumer,
            concurrency: self.concurrency,
            read_block: Duration::from_millis(200),
            heartbeat_interval: Duration::from_millis(300),
            lease_ttl: Duration::from_secs(2),
            reclaim_min_idle: Duration::from_secs(2),
            reclaim_interval: Duration::from_millis(500),
            ..WorkerSettings::default()
        };
        // The scripted model is opted into, never the default.
        cfg.default_provider = Some("scripted".into());
        cfg.providers.script = Some(self.script.to_string());
        tweak(&mut cfg);
        let (url, redis_url, redis) = (self.url.clone(), self.redis.url(), self.redis.settings());
        let stop = self.stop.child_token();
        let (crash, crashed) = tokio::sync::oneshot::channel::<()>();
        let (started_tx, started) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let store = Arc::new(PgStore::connect(&url, 8).await.unwrap());
                let queue = Arc::new(RedisQueue::connect_with(&redis_url, &redis).await.unwrap());
                let w = Worker::new(store, queue, cfg);
                let _ = started_tx.send(());
                tokio::select! {
                    _ = w.run(stop) => {}
                    // A dropped sender is not a crash: only `send` is.
                    Ok(()) = crashed => {}
                }
            });
            // Every task the worker spawned dies with its runtime, unfinished.
            rt.shutdown_background();
        });
        started.await.unwrap();
        WorkerProcess { crash, thread }
    }

    /// Start one more worker, its settings changed by `tweak`: a test that must look at a
    /// session before any worker can take it starts the cluster with none, then adds one.
    pub async fn add_worker(&mut self, tweak: &impl Fn(&mut WorkerSettings)) {
        let w = self.start_worker(self.workers.len(), tweak).await;
        self.workers.push(w);
    }

    /// Crash worker `i` (its runtime dropped mid-flight: no lease given back, no entry
    /// acked, no task left behind) and start another (untweaked) in its place.
    pub async fn crash_and_replace(&mut self, i: usize) {
        self.crash_and_replace_with(i, &|_| {}).await;
    }

    /// [`Cluster::crash_and_replace`], the new worker's settings changed by `tweak`.
    pub async fn crash_and_replace_with(&mut self, i: usize, tweak: &impl Fn(&mut WorkerSettings)) {
        let next = self.start_worker(i, tweak).await;
        let old = std::mem::replace(&mut self.workers[i], next);
        old.crash().await;
    }

    /// Submit a root session of tenant [`TENANT`] with `tools`, as the API does.
    pub async fn submit(
        &self,
        prompt: &str,
        tools: &[&str],
        tweak: impl Fn(&mut SessionSpec),
    ) -> String {
        self.submit_to("default", prompt, tools, tweak).await
    }

    /// [`Cluster::submit`] on `queue`.
    pub async fn submit_to(
        &self,
        queue: &str,
        prompt: &str,
        tools: &[&str],
        tweak: impl Fn(&mut SessionSpec),
    ) -> String {
        let mut spec = SessionSpec::new(prompt);
        spec.tools = Some(tools.iter().map(|s| s.to_string()).collect());
        spec.retry_delay_ms = 10;
        tweak(&mut spec);
        let (row, _) = self
            .store
            .create_session(&NewSession::root(spec, queue).with_tenant(TENANT))
            .await
            .unwrap();
        self.queue
            .enqueue(queue, &row.id, EnqueueReason::New)
            .await
            .unwrap();
        self.store
            .mark_enqueued(std::slice::from_ref(&row.id))
            .await
            .unwrap();
        row.id
    }

    pub async fn row(&self, id: &str) -> SessionRow {
        row(&self.store, id).await
    }

    pub async fn wait_status(
        &self,
        id: &str,
        want: &[SessionStatus],
        limit: Duration,
    ) -> SessionRow {
        wait_status(&self.store, id, want, limit).await
    }

    /// Wait until `ids` have ended (on their completions).
    pub async fn wait_terminal(&self, ids: &[String], limit: Duration) -> Vec<SessionRow> {
        wait_terminal(&self.store, &self.queue, ids, limit).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.api))
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self
            .http
            .get(format!("{}{path}", self.api))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// The session's events stream until `enough` says what was read suffices (or the
    /// server ends it); `(event, data)` pairs.
    pub async fn events_until(
        &self,
        id: &str,
        enough: impl Fn(&[(String, Value)]) -> bool,
    ) -> Vec<(String, Value)> {
        let resp = self
            .http
            .get(format!("{}/v1/sessions/{id}/events", self.api))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let mut body = resp.bytes_stream();
        let (mut buf, mut out) = (String::new(), Vec::new());
        while !enough(&out) {
            let chunk = tokio::time::timeout(Duration::from_secs(30), body.next())
                .await
                .expect("no event within 30 s");
            let Some(chunk) = chunk else { break };
            buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            while let Some(end) = buf.find("\n\n") {
                let block: String = buf.drain(..end + 2).collect();
                let event = block.lines().find_map(|l| l.strip_prefix("event: "));
                let data = block.lines().find_map(|l| l.strip_prefix("data: "));
                if let (Some(e), Some(d)) = (event, data) {
                    out.push((e.to_string(), serde_json::from_str(d).unwrap()));
                }
            }
        }
        out
    }

    /// Sessions listed by `filter` (up to 10,000).
    pub async fn list(&self, filter: ListFilter) -> Vec<SessionRow> {
        self.store
            .list(&ListFilter {
                limit: 10_000,
                ..filter
            })
            .await
            .unwrap()
    }

    pub async fn children(&self, id: &str) -> Vec<SessionRow> {
        self.list(ListFilter {
            parent_id: Some(id.to_string()),
            ..Default::default()
        })
        .await
    }

    /// Every session of the tree rooted at `root`.
    pub async fn tree(&self, root: &str) -> Vec<SessionRow> {
        let all = self.list(ListFilter::default()).await;
        all.into_iter().filter(|r| r.root_id == root).collect()
    }

    /// Wait until every session of the tree is finished and no sweep is left to do.
    pub async fn settled_tree(&self, root: &str, limit: Duration) -> Vec<SessionRow> {
        wait_until(format_args!("tree {root} to settle"), limit, || async {
            let tree = self.tree(root).await;
            let unreturned = self.store.unreturned_budgets(1000).await.unwrap();
            if tree.iter().all(|r| r.status.is_terminal()) && unreturned.is_empty() {
                Ok(tree)
            } else {
                Err(tree.iter().map(|r| (r.depth, r.status)).collect::<Vec<_>>())
            }
        })
        .await
    }

    /// Run `act` (a request that may start `id` again) and, when `started` says from its
    /// answer that it did, wait for the session's next completion: subscribed before the
    /// request, so it cannot be missed.
    pub async fn start_again(
        &self,
        id: &str,
        act: impl Future<Output = (u16, Value)>,
        started: impl Fn(u16) -> bool,
    ) -> (u16, Value) {
        let mut done = self.queue.subscribe_completion(id).await.unwrap();
        let answer = act.await;
        if started(answer.0) {
            tokio::time::timeout(Duration::from_secs(60), done.next())
                .await
                .expect("the session ends")
                .expect("a completion");
        }
        answer
    }

    pub async fn shutdown(self) {
        self.stop.cancel();
        for w in self.workers {
            w.join(Duration::from_secs(20)).await;
        }
    }
}
