//! A scheduler served in process for a test: a fresh store (a database of the shared
//! Postgres with a private Redis, or a SQLite file with the in-process queue), the
//! `default` queue, the API on a free port with [`ADMIN_KEY`] as its admin key, and two
//! tenants' keys (acme and globex, sessions read and write).

use std::sync::Arc;

use agentq_core::auth::{self, Scope};
use agentq_core::mem_queue::MemQueue;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::sqlite::SqliteStore;
use agentq_core::{Queue, Store};
use agentq_scheduler::{Scheduler, SchedulerSettings, router};
use agentq_testkit::{RedisServer, shared_postgres};

/// The admin key of every [`Served`] scheduler.
pub const ADMIN_KEY: &str = "served-scheduler-test-admin-key";

/// Which store (and queue) a [`Served`] scheduler runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// A fresh database of the shared Postgres, a private Redis.
    Postgres,
    /// A SQLite file in a temporary directory, the in-process queue.
    Sqlite,
}

/// A scheduler serving its API, and what keeps its services alive.
pub struct Served {
    /// `http://127.0.0.1:<port>`
    pub base: String,
    pub state: Scheduler,
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    /// The Postgres database (none on SQLite).
    pub db_url: Option<String>,
    /// acme's and globex's keys: sessions read and write.
    pub acme: String,
    pub globex: String,
    _redis: Option<RedisServer>,
    _dir: Option<tempfile::TempDir>,
}

impl Served {
    /// On Postgres, with `settings` (their admin key replaced by [`ADMIN_KEY`]).
    pub async fn start(settings: SchedulerSettings) -> Served {
        Served::on(Backend::Postgres, settings).await
    }

    /// On `backend`, with `settings` (their admin key replaced by [`ADMIN_KEY`]).
    pub async fn on(backend: Backend, mut settings: SchedulerSettings) -> Served {
        let (store, queue, db_url, redis, dir): (Arc<dyn Store>, Arc<dyn Queue>, _, _, _) =
            match backend {
                Backend::Postgres => {
                    let db_url =
                        agentq_testkit::migrated_database(shared_postgres().unwrap()).unwrap();
                    let store = PgStore::connect(&db_url, 8).await.unwrap();
                    store.migrate().await.unwrap();
                    let redis = RedisServer::start().unwrap();
                    let queue = RedisQueue::connect(&redis.url()).await.unwrap();
                    (
                        Arc::new(store),
                        Arc::new(queue),
                        Some(db_url),
                        Some(redis),
                        None,
                    )
                }
                Backend::Sqlite => {
                    let dir = tempfile::tempdir().unwrap();
                    let store = SqliteStore::open(&dir.path().join("agentq.db"))
                        .await
                        .unwrap();
                    store.migrate().await.unwrap();
                    (
                        Arc::new(store),
                        Arc::new(MemQueue::new()),
                        None,
                        None,
                        Some(dir),
                    )
                }
            };
        queue.ensure_queue("default").await.unwrap();
        settings.auth = settings.auth.with_admin_key(ADMIN_KEY);
        let state = Scheduler::new(store.clone(), queue.clone(), settings);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = router(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let mut served = Served {
            base,
            state,
            store,
            queue,
            db_url,
            acme: String::new(),
            globex: String::new(),
            _redis: redis,
            _dir: dir,
        };
        let sessions = [Scope::SessionsRead, Scope::SessionsWrite];
        served.acme = served.key("acme", &sessions).await;
        served.globex = served.key("globex", &sessions).await;
        served
    }

    /// A new key of `tenant` with `scopes`.
    pub async fn key(&self, tenant: &str, scopes: &[Scope]) -> String {
        let (new, key) = auth::generate(tenant, scopes.to_vec(), None, None).unwrap();
        self.store.create_key(&new).await.unwrap();
        key
    }
}
