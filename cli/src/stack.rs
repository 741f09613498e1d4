//! Opening a backend for workers, shared by `agentq dev` and `agentq demo` ([`Stack`]):
//! the embedded one (a SQLite file and the in-process queue) — including the recovery
//! step of the embedded mode, which puts every session that was queued or running when
//! the previous process died back on the queue — or Postgres and Redis. And [`redact`],
//! which every command uses to show a URL without its password.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, anyhow};

use agentq_core::WorkQueue;
use agentq_core::blob::s3::S3Blobs;
use agentq_core::mem_queue::MemQueue;
use agentq_core::pg::PgStore;
use agentq_core::redis_queue::RedisQueue;
use agentq_core::sharded::ShardedStore;
use agentq_core::sqlite::{SqliteStore, requeue_runnable};
use agentq_core::{Queue, Store};

/// Connections of the Postgres pool shared by the API and the workers of one process.
const DEV_PG_CONNS: u32 = 16;

/// A store and a queue, opened and ready for workers.
pub struct Stack {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    /// Set in the embedded mode (the demo reads its file directly).
    pub sqlite: Option<SqliteStore>,
    /// Set in the embedded mode (the demo follows completions on it).
    pub mem_queue: Option<Arc<MemQueue>>,
    /// One line for the user: where the data lives.
    pub description: String,
    /// The store and the queue for the start line, without secrets.
    pub store_url: String,
    pub queue_url: String,
    /// Sessions put back on the queue at start (embedded mode: left over by a previous
    /// process that was killed).
    pub requeued: usize,
}

impl Stack {
    /// The embedded backend: the SQLite file at `path` (created and migrated as needed)
    /// and a fresh in-process queue with a group for each of `queues`. With `recover`,
    /// every session still queued or running in the file goes back on the queue — the
    /// queue lived in the memory of the process that wrote them.
    /// `objects`: where the bytes of workspace contents live, when not in the database.
    pub async fn embedded(
        path: &Path,
        queues: &[String],
        recover: bool,
        objects: Option<Arc<S3Blobs>>,
    ) -> anyhow::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let mut store = SqliteStore::open(path)
            .await
            .with_context(|| format!("cannot open the database {}", path.display()))?;
        if let Some(o) = objects {
            store = store.with_objects(o);
        }
        store
            .migrate()
            .await
            .with_context(|| format!("cannot migrate the database {}", path.display()))?;
        let queue = Arc::new(MemQueue::new());
        for q in queues {
            queue.ensure_queue(q).await?;
        }
        let requeued = if recover {
            requeue_runnable(&store, queue.as_ref())
                .await
                .context("cannot re-enqueue the sessions of a previous run")?
        } else {
            0
        };
        Ok(Stack {
            store: Arc::new(store.clone()),
            queue: queue.clone(),
            sqlite: Some(store),
            mem_queue: Some(queue),
            description: format!("embedded store {}, in-process queue", path.display()),
            store_url: format!("sqlite://{}", path.display()),
            queue_url: "in-process".into(),
            requeued,
        })
    }

    /// Postgres and Redis. The schema is brought up to date (this is a development
    /// command; the distributed deployment runs `agentq migrate` explicitly).
    /// `writers`: the worker's commits in flight, plus one for its heartbeat.
    pub async fn services(
        database_url: &str,
        redis_url: &str,
        writers: u32,
        objects: Option<Arc<S3Blobs>>,
    ) -> anyhow::Result<Self> {
        let urls: Vec<String> = database_url
            .split(',')
            .map(|u| u.trim().to_string())
            .collect();
        let shards = open_shards(&urls, objects, |u| async move {
            PgStore::connect_with_writers(&u, DEV_PG_CONNS, writers).await
        })
        .await?;
        for shard in &shards {
            shard.migrate().await.context("migration failed")?;
        }
        let store = one_store(shards).await?;
        let queue = RedisQueue::connect(redis_url)
            .await
            .map_err(|e| connect_error(e, "Redis", redis_url))?;
        Ok(Stack {
            store,
            queue: Arc::new(queue),
            sqlite: None,
            mem_queue: None,
            description: format!(
                "Postgres {}, Redis {}",
                redact(database_url),
                redact(redis_url)
            ),
            store_url: redact(database_url),
            queue_url: redact(redis_url),
            requeued: 0,
        })
    }
}

/// A failed connection to `service` at `url` as a process reports it: an unreachable
/// server already says where and why (once); any other failure gets the service and the
/// URL without its password.
pub fn connect_error(e: agentq_core::Error, service: &str, url: &str) -> anyhow::Error {
    match e {
        agentq_core::Error::Unreachable { .. } => anyhow::Error::new(e),
        e => {
            anyhow::Error::new(e).context(format!("cannot connect to {service} at {}", redact(url)))
        }
    }
}

// The Postgres a process opens from `database_url`: one URL, the plain `PgStore` as
// always (no routing on the way); several between commas, a `ShardedStore` over one
// `PgStore` per URL, the control shard first (see docs/scale.md).

/// Every shard opened with `connect` (each its own pools), with the blob store's
/// objects when given.
pub(crate) async fn open_shards<F, Fut>(
    urls: &[String],
    objects: Option<Arc<S3Blobs>>,
    connect: F,
) -> anyhow::Result<Vec<PgStore>>
where
    F: Fn(String) -> Fut,
    Fut: Future<Output = agentq_core::Result<PgStore>>,
{
    if urls.is_empty() {
        return Err(anyhow!(
            "no database configured: set AGENTQ_DATABASE_URL (or database_url in agentq.toml)"
        ));
    }
    let mut shards = Vec::with_capacity(urls.len());
    for url in urls {
        let mut store = connect(url.clone())
            .await
            .map_err(|e| connect_error(e, "Postgres", url))?;
        if let Some(o) = &objects {
            store = store.with_objects(o.clone());
        }
        shards.push(store);
    }
    Ok(shards)
}

/// One store over `shards`: the store itself when there is one; else the sharded store,
/// its shard map read and checked against the shards given.
pub(crate) async fn one_store(mut shards: Vec<PgStore>) -> anyhow::Result<Arc<dyn Store>> {
    if shards.len() == 1
        && let Some(store) = shards.pop()
    {
        return Ok(Arc::new(store));
    }
    Ok(Arc::new(ShardedStore::open(shards).await?))
}

/// Hide the password of a URL in messages and logs: `postgres://u:***@h/db`. Anything
/// that does not look like a URL with one is shown as it is; several URLs between commas
/// (shards, seed nodes) each.
pub fn redact(url: &str) -> String {
    if url.contains(',') && url.contains("://") {
        return url.split(',').map(redact).collect::<Vec<_>>().join(",");
    }
    let Some(s) = url.find("://") else {
        return url.to_string();
    };
    // A query may hold an `@` (an e-mail address); a password may hold a `/`.
    let rest = &url[s + 3..];
    let before_query = rest.find(['?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..before_query].rfind('@') else {
        return url.to_string();
    };
    match rest[..at].find(':') {
        Some(c) => format!("{}{}:***{}", &url[..s + 3], &rest[..c], &rest[at..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_passwords_only() {
        for (url, shown) in [
            ("postgres://u:p@h/db", "postgres://u:***@h/db"),
            (
                "postgres://u:p@h/db,postgres://v:q@i/db",
                "postgres://u:***@h/db,postgres://v:***@i/db",
            ),
            ("redis://:p@h:6379", "redis://:***@h:6379"),
            ("postgres://u:p/q@h:5432/db", "postgres://u:***@h:5432/db"),
            ("postgres://u:p@h/db?x=a@b", "postgres://u:***@h/db?x=a@b"),
            ("redis://h:6379/0", "redis://h:6379/0"),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("redis://h:6379/?user=a:b@c", "redis://h:6379/?user=a:b@c"),
            ("not a url", "not a url"),
            ("://@", "://@"),
            ("", ""),
        ] {
            assert_eq!(redact(url), shown, "{url}");
        }
    }
}
