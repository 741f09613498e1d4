//! Removing everything a run created.

use anyhow::Context;

use crate::env::Env;

/// Remove every row, table and key of this run.
pub async fn cleanup(env: &Env) -> anyhow::Result<()> {
    let pattern = format!("bench-{}-%", env.run);
    let ids: Vec<(String,)> = sqlx::query_as("SELECT id FROM sessions WHERE queue LIKE $1")
        .bind(&pattern)
        .fetch_all(env.store.pool())
        .await?;
    let client = redis::Client::open(env.redis_url.as_str())?;
    let mut c = client
        .get_multiplexed_async_connection()
        .await
        .context("connecting to Redis for the clean-up")?;
    for chunk in ids.chunks(500) {
        let keys: Vec<String> = chunk
            .iter()
            .map(|(id,)| agentq_core::queue::events_stream(id))
            .collect();
        let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut c).await?;
    }
    let mut cursor: u64 = 0;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("*bench*{}*", env.run))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await?;
        if !keys.is_empty() {
            let _: i64 = redis::cmd("DEL").arg(&keys).query_async(&mut c).await?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    // Messages have no foreign key to cascade from: delete them with their sessions.
    sqlx::query(
        "WITH s AS (DELETE FROM sessions WHERE queue LIKE $1 RETURNING root_id, id) \
         DELETE FROM messages m USING s \
         WHERE m.root_id = s.root_id::uuid AND m.session_id = s.id::uuid",
    )
    .bind(&pattern)
    .execute(env.store.pool())
    .await?;
    // The scale part's tenant.
    for table in ["tenant_holds", "tenant_spend", "tenant_ledger"] {
        sqlx::query(&format!("DELETE FROM {table} WHERE tenant LIKE $1"))
            .bind(&pattern)
            .execute(env.store.pool())
            .await?;
    }
    sqlx::query(&format!(
        "DROP TABLE IF EXISTS agentq_bench_ceiling_{}",
        env.run
    ))
    .execute(env.store.pool())
    .await?;
    Ok(())
}
