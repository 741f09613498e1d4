//! The raw ceilings: durable one-row commits/s of this Postgres and XADD/XREADGROUP/XACK
//! round trips/s of this Redis, at the workers' connection count; and the floor under one
//! session alone: the round trip of one such commit with nothing else running.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::PgPoolOptions;

use crate::cpu::Sample;
use crate::env::Env;
use crate::report::Results;
use crate::turns::TURN_TEXT;

pub async fn ceiling(env: &Env, r: &mut Results) -> anyhow::Result<()> {
    // As many connections as the workers' main pools hold (see `crate::pools`).
    let conns = env
        .args
        .workers
        .saturating_mul(env.pools.main(env.args.concurrency));
    let secs = Duration::from_secs_f64(env.args.ceiling_secs.clamp(0.5, 600.0));
    r.ceiling_connections = Some(conns);
    let pg = pg_ceiling(env, conns, secs).await?;
    r.ceiling_commits_per_s = Some(pg.rate);
    r.ceiling_cpu_ms_per_commit = pg.cpu_ms_per_op(|s| Some(s.own? + s.postgres?));
    r.ceiling_redis_roundtrips_per_s = Some(redis_ceiling(env, conns, secs).await?.rate);
    Ok(())
}

/// What `measure` saw between its warm-up and the end.
struct Measured {
    rate: f64,
    ops: u64,
    cpu: Sample,
}

impl Measured {
    /// Milliseconds of CPU (as `pick` adds it up) per counted operation.
    fn cpu_ms_per_op(&self, pick: impl Fn(&Sample) -> Option<f64>) -> Option<f64> {
        if self.ops == 0 {
            return None;
        }
        Some(pick(&self.cpu)? * 1000.0 / self.ops as f64)
    }
}

/// Operations a measurement counts at least: a window in which a stalled server (a
/// saturated machine, an fsync that hangs) finished next to none is not a rate.
const MIN_COUNTED: u64 = 100;
/// How far past its planned end a measurement runs waiting for [`MIN_COUNTED`], in
/// planned lengths.
const MAX_STRETCH: u32 = 20;

/// Rate of counted operations between a warm-up and the end, over `tasks` loops that run
/// until told to stop. The end is put off (up to [`MAX_STRETCH`] times the length) until
/// [`MIN_COUNTED`] operations were counted in it.
async fn measure<F, Fut>(env: &Env, tasks: u32, secs: Duration, make: F) -> anyhow::Result<Measured>
where
    F: Fn(u32, Arc<AtomicU64>, Arc<AtomicBool>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let count = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let warm = Duration::from_millis(500);
    let start = Instant::now();
    let mut hs = Vec::new();
    for i in 0..tasks {
        hs.push(tokio::spawn(make(i, count.clone(), stop.clone())));
    }
    tokio::time::sleep_until((start + warm).into()).await;
    let cpu0 = env.cpu.sample().await;
    let c0 = count.load(Ordering::Relaxed);
    let t0 = Instant::now();
    tokio::time::sleep_until((t0 + secs).into()).await;
    let longest = secs.saturating_mul(MAX_STRETCH);
    while count.load(Ordering::Relaxed).saturating_sub(c0) < MIN_COUNTED && t0.elapsed() < longest {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c1 = count.load(Ordering::Relaxed);
    let dt = t0.elapsed();
    let cpu = env.cpu.sample().await.since(&cpu0);
    stop.store(true, Ordering::Relaxed);
    for h in hs {
        h.await??;
    }
    Ok(Measured {
        rate: (c1 - c0) as f64 / dt.as_secs_f64(),
        ops: c1 - c0,
        cpu,
    })
}

/// The ceiling's table and its one-row INSERT, about the size of one message: the
/// statement and its value.
async fn commit_table(env: &Env, pool: &sqlx::PgPool) -> anyhow::Result<(Arc<str>, Arc<str>)> {
    let table = format!("agentq_bench_ceiling_{}", env.run);
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (id bigserial PRIMARY KEY, k text NOT NULL, v text NOT NULL)"
    ))
    .execute(pool)
    .await?;
    let sql: Arc<str> = Arc::from(format!("INSERT INTO {table} (k, v) VALUES ($1, $2)"));
    Ok((sql, Arc::from(TURN_TEXT.repeat(2))))
}

/// One-row INSERTs, each its own durable commit, on `conns` connections at once.
async fn pg_ceiling(env: &Env, conns: u32, secs: Duration) -> anyhow::Result<Measured> {
    let pool = PgPoolOptions::new()
        .max_connections(conns)
        .min_connections(conns)
        .connect(&env.db_url)
        .await?;
    let (sql, value) = commit_table(env, &pool).await?;
    let measured = measure(env, conns, secs, |i, count, stop| {
        let pool = pool.clone();
        let value = value.clone();
        let sql = sql.clone();
        async move {
            let mut conn = pool.acquire().await?;
            let key = format!("task-{i}");
            while !stop.load(Ordering::Relaxed) {
                sqlx::query(&sql)
                    .bind(&key)
                    .bind(&*value)
                    .execute(&mut *conn)
                    .await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        }
    })
    .await?;
    pool.close().await;
    Ok(measured)
}

/// Commits [`lone_commits`] times before it measures.
const LONE_WARM_UP: usize = 100;
/// Commits [`lone_commits`] measures: as many as the overhead part's samples.
const LONE_SAMPLES: usize = 1_000;

/// The round trip of each of [`LONE_SAMPLES`] one-row durable commits (the ceiling's),
/// one at a time on one connection, nothing else running: what one session alone waits
/// for at least once per iteration (one commit's round trip, its fsync, the wake-ups of
/// the two processes), whatever agentq does. It moves with the machine: on this VM its
/// p50 has varied about threefold within an hour.
pub async fn lone_commits(env: &Env) -> anyhow::Result<Vec<Duration>> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&env.db_url)
        .await?;
    let (sql, value) = commit_table(env, &pool).await?;
    let mut conn = pool.acquire().await?;
    let mut samples = Vec::with_capacity(LONE_SAMPLES);
    for i in 0..LONE_WARM_UP + LONE_SAMPLES {
        let t = Instant::now();
        sqlx::query(&sql)
            .bind("lone")
            .bind(&*value)
            .execute(&mut *conn)
            .await?;
        if i >= LONE_WARM_UP {
            samples.push(t.elapsed());
        }
    }
    drop(conn);
    pool.close().await;
    Ok(samples)
}

/// XADD, XREADGROUP (one entry), XACK in a loop; each command is one round trip. One
/// multiplexed connection per worker, as the workers have, shared by the loops.
async fn redis_ceiling(env: &Env, tasks: u32, secs: Duration) -> anyhow::Result<Measured> {
    let client = redis::Client::open(env.redis_url.as_str())?;
    let mut conns = Vec::new();
    for _ in 0..env.args.workers.max(1) {
        conns.push(client.get_multiplexed_async_connection().await?);
    }
    let prefix = format!("agentq:bench:{}:ceiling", env.run);
    for i in 0..tasks {
        let mut c = conns[i as usize % conns.len()].clone();
        let _: redis::RedisResult<()> = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(format!("{prefix}:{i}"))
            .arg("g")
            .arg("$")
            .arg("MKSTREAM")
            .query_async(&mut c)
            .await;
    }
    let measured = measure(env, tasks, secs, |i, count, stop| {
        let mut c = conns[i as usize % conns.len()].clone();
        let key = format!("{prefix}:{i}");
        async move {
            while !stop.load(Ordering::Relaxed) {
                let _: String = redis::cmd("XADD")
                    .arg(&key)
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(1000)
                    .arg("*")
                    .arg("session")
                    .arg("0194f0b2-7d6c-7c4e-9d7a-3f1e2a4b5c6d")
                    .query_async(&mut c)
                    .await?;
                let reply: redis::streams::StreamReadReply = redis::cmd("XREADGROUP")
                    .arg("GROUP")
                    .arg("g")
                    .arg("c")
                    .arg("COUNT")
                    .arg(1)
                    .arg("STREAMS")
                    .arg(&key)
                    .arg(">")
                    .query_async(&mut c)
                    .await?;
                let ids: Vec<String> = reply
                    .keys
                    .into_iter()
                    .flat_map(|k| k.ids.into_iter().map(|e| e.id))
                    .collect();
                let _: i64 = redis::cmd("XACK")
                    .arg(&key)
                    .arg("g")
                    .arg(&ids)
                    .query_async(&mut c)
                    .await?;
                count.fetch_add(3, Ordering::Relaxed);
            }
            Ok(())
        }
    })
    .await?;
    Ok(measured)
}
