//! The storage part: bytes stored per iteration for sessions of 10, 40 and 160 iterations.

use anyhow::bail;

use agentq_agent::schema::Message;
use agentq_core::pg::PgStore;

use crate::env::Env;
use crate::report::{Results, progress};
use crate::turns::PROMPT;
use crate::workload::{Workload, run_workload};

/// What autovacuum would do: trailing pages that concurrent inserts pre-allocated but
/// never filled are given back, dead row versions become reusable space.
async fn vacuum(env: &Env) -> anyhow::Result<()> {
    sqlx::query("VACUUM sessions, session_specs, messages")
        .execute(env.store.pool())
        .await?;
    Ok(())
}

/// Sizes of what sessions are stored in: heap, indexes, TOAST (with its index) — in that
/// order, for `sessions` with `session_specs`, then `messages`.
async fn stored_bytes(env: &Env) -> anyhow::Result<[i64; 6]> {
    let row: (i64, i64, i64, i64, i64, i64) = sqlx::query_as(
        "WITH t(name, grp) AS (VALUES ('sessions', 0), ('session_specs', 0), ('messages', 1)), \
              z AS (SELECT grp, pg_relation_size(name::regclass) AS heap, \
                           pg_indexes_size(name::regclass) AS idx, \
                           pg_total_relation_size(name::regclass) AS total FROM t) \
         SELECT sum(heap) FILTER (WHERE grp = 0)::bigint, sum(idx) FILTER (WHERE grp = 0)::bigint, \
                sum(total - heap - idx) FILTER (WHERE grp = 0)::bigint, \
                sum(heap) FILTER (WHERE grp = 1)::bigint, sum(idx) FILTER (WHERE grp = 1)::bigint, \
                sum(total - heap - idx) FILTER (WHERE grp = 1)::bigint FROM z",
    )
    .fetch_one(env.store.pool())
    .await?;
    Ok([row.0, row.1, row.2, row.3, row.4, row.5])
}

/// `url` with its database name replaced by `db`.
pub(crate) fn with_database(url: &str, db: &str) -> Option<String> {
    let scheme = url.find("://")? + 3;
    let slash = url[scheme..].find('/').map(|i| scheme + i);
    let query = url.find('?');
    Some(match (slash, query) {
        (Some(s), Some(q)) if q > s => format!("{}/{db}{}", &url[..s], &url[q..]),
        (Some(s), _) => format!("{}/{db}", &url[..s]),
        (None, Some(q)) => format!("{}/{db}{}", &url[..q], &url[q..]),
        (None, None) => format!("{url}/{db}"),
    })
}

/// A database of its own for one storage run, so that no run reuses the free space another
/// left (pages pre-allocated by concurrent inserts, then recorded as free by VACUUM).
/// `None` when this role may not create databases: the run then shares the main one.
async fn scratch_database(env: &Env, name: &str) -> Option<(Env, String)> {
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(env.store.pool())
        .await
        .map_err(|e| {
            progress(&format!(
                "storage: cannot create a database ({e}); measuring in the main one"
            ))
        })
        .ok()?;
    let url = with_database(&env.db_url, name)?;
    let store = PgStore::connect(&url, 8).await.ok()?;
    store.migrate().await.ok()?;
    Some((env.derived(url, store), name.to_string()))
}

/// Bytes per iteration for K = 10, 40, 160, each in a fresh database when allowed.
pub async fn storage(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    // The same number of iterations for each K (50 × 160 by default): every run then
    // leaves the same fixed slack (each connection's half-filled insert page), which would
    // otherwise weigh more on the short runs.
    let base = env.args.sessions.min(50);
    for (k, part) in [(10, "storage10"), (40, "storage40"), (160, "storage160")] {
        let n = base * 160 / k;
        progress(&format!("storage: {n} sessions of {k} iterations"));
        let scratch = scratch_database(env, &format!("agentq_bench_{}_{part}", env.run)).await;
        let target = scratch.as_ref().map_or(env, |(e, _)| e);
        let measured = storage_run(target, r, k, n, part).await;
        if let Some((e, name)) = scratch {
            e.store.pool().close().await;
            drop(e);
            // The workers' pools are gone; FORCE ends any connection still closing.
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                .execute(env.store.pool())
                .await;
        }
        measured?;
    }
    Ok(())
}

async fn storage_run(
    env: &Env,
    r: &mut Results,
    k: u32,
    n: u32,
    part: &'static str,
) -> anyhow::Result<()> {
    vacuum(env).await?;
    let before = stored_bytes(env).await?;
    let ran = run_workload(
        env,
        &Workload {
            part,
            tool: env.tool(),
            sessions: n,
            iterations: k,
            warm_up: false,
            rounds: 1,
        },
    )
    .await?;
    vacuum(env).await?;
    let after = stored_bytes(env).await?;
    if ran.failed > 0 {
        bail!(
            "storage: {} of {n} sessions of {k} iterations did not complete",
            ran.failed
        );
    }
    // Every history starts with the prompt, which a session created since migration 0005
    // keeps only in its spec: it counts as a message all the same.
    let (stored, implicit): (i64, i64) = sqlx::query_as(
        "SELECT (SELECT coalesce(sum(octet_length(m.body::text)), 0) \
                 FROM sessions s JOIN messages m \
                   ON m.root_id = s.root_id::uuid AND m.session_id = s.id::uuid \
                 WHERE s.queue = $1)::bigint, \
                (SELECT count(*) FROM sessions s WHERE s.queue = $1 AND NOT EXISTS \
                   (SELECT 1 FROM messages m WHERE m.root_id = s.root_id::uuid \
                      AND m.session_id = s.id::uuid AND m.seq = 0))::bigint",
    )
    .bind(env.queue(part))
    .fetch_one(env.store.pool())
    .await?;
    let msg = stored + implicit * serde_json::to_string(&Message::user(PROMPT))?.len() as i64;
    let iters = f64::from(n) * f64::from(k);
    let d: Vec<f64> = after
        .iter()
        .zip(before.iter())
        .map(|(a, b)| (a - b) as f64 / iters)
        .collect();
    progress(&format!(
        "storage: K={k}: per iteration sessions heap {:.0} + indexes {:.0} + toast {:.0}, \
         messages heap {:.0} + indexes {:.0} + toast {:.0}; message JSON {:.0}",
        d[0],
        d[1],
        d[2],
        d[3],
        d[4],
        d[5],
        msg as f64 / iters
    ));
    r.bytes_per_iteration.insert(k, d.iter().sum());
    r.message_bytes_per_iteration.insert(k, msg as f64 / iters);
    Ok(())
}
