//! Schedules across a SIGKILL of a real `agentq scheduler`, at the two moments a fire can
//! be cut: after its session was created and before the fire was recorded, and after the
//! claim and before anything was created. The test stops the process there without any
//! fault switch in the binary: its own Postgres connection holds a lock the next
//! statement of the fire needs, waits until the scheduler's backend is blocked on it
//! (`pg_stat_activity`), SIGKILLs the process and lets the lock go. A second scheduler
//! then takes over once the dead one's lease ends (`[schedules] lease_secs`, short here):
//! each fire time has exactly one session, recorded with it, and the fire times after it
//! come once each, none missed.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection, Row};

use agentq_core::auth::{self, Scope};
use agentq_scheduler::schedules::fire_key;

use crate::common::{Cluster, agentq_bin, eventually, poll};

const T: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);
/// The schedule's interval: fires come every 2 s.
const EVERY_SECS: i64 = 2;
/// The fire loop's settings: a killed scheduler's claim ends within seconds.
const POLL_SECS: &str = "1";
const LEASE_SECS: &str = "3";

/// An `agentq scheduler` process, SIGKILLed on drop (its log printed if the test failed).
struct SchedulerProc {
    child: Child,
    log: PathBuf,
    url: String,
}

impl SchedulerProc {
    async fn start(c: &Cluster, dir: &Path, name: &str) -> SchedulerProc {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).unwrap();
        let child = Command::new(agentq_bin())
            .args(["scheduler", "--addr", "127.0.0.1:0"])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .env("AGENTQ_DATABASE_URL", &c.db_url)
            .env("AGENTQ_REDIS_URL", c.redis.url())
            .env(
                "AGENTQ_REDIS_CLUSTER",
                c.redis.settings().cluster.to_string(),
            )
            .env("AGENTQ_SCHEDULES_POLL_SECS", POLL_SECS)
            .env("AGENTQ_SCHEDULES_LEASE_SECS", LEASE_SECS)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("spawning agentq scheduler");
        let mut p = SchedulerProc {
            child,
            log,
            url: String::new(),
        };
        let listening = |p: &SchedulerProc| {
            p.log_text()
                .split("listening on ")
                .nth(1)
                .and_then(|s| s.split_whitespace().next().map(str::to_string))
        };
        assert!(
            poll(POLL, T, async || listening(&p).is_some()).await,
            "the scheduler did not start: {}",
            p.log_text()
        );
        p.url = listening(&p).unwrap();
        p
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL, and reap.
    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM (the pass in progress ends first), and wait for the exit.
    async fn stop(&mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let exited = poll(POLL, T, async || self.child.try_wait().unwrap().is_some()).await;
        assert!(exited, "the scheduler did not stop: {}", self.log_text());
    }
}

impl Drop for SchedulerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "----- {} (tail) -----\n{}",
                self.log.display(),
                agentq_testkit::log_tail(&self.log, 40)
            );
        }
    }
}

/// A fire as recorded: its time, outcome, session and when it was recorded.
#[derive(Debug, Clone, PartialEq)]
struct Fire {
    time: DateTime<Utc>,
    outcome: String,
    session: Option<String>,
    recorded_at: DateTime<Utc>,
}

/// The test's view of the database, on connections of its own: the control shard (the
/// schedules and their fires), and every shard, where the fires' sessions are (each on its
/// own tree's).
struct Db {
    conn: PgConnection,
    shards: Vec<PgConnection>,
}

impl Db {
    async fn connect(c: &Cluster) -> Db {
        let mut shards = Vec::new();
        for url in c.db_url.split(',') {
            shards.push(PgConnection::connect(url).await.unwrap());
        }
        Db {
            conn: PgConnection::connect(c.control_db_url()).await.unwrap(),
            shards,
        }
    }

    async fn fires(&mut self, id: &str) -> Vec<Fire> {
        sqlx::query(
            "SELECT fire_time, outcome, session_id, recorded_at FROM schedule_fires \
             WHERE schedule_id = $1 ORDER BY fire_time",
        )
        .bind(id)
        .fetch_all(&mut self.conn)
        .await
        .unwrap()
        .into_iter()
        .map(|r| Fire {
            time: r.get(0),
            outcome: r.get(1),
            session: r.get(2),
            recorded_at: r.get(3),
        })
        .collect()
    }

    /// The sessions schedule `id` created, as (id, idempotency key), by key.
    async fn sessions(&mut self, id: &str) -> Vec<(String, String)> {
        let mut all = Vec::new();
        for shard in &mut self.shards {
            let rows = sqlx::query(
                "SELECT id, idempotency_key FROM sessions WHERE idempotency_key LIKE $1",
            )
            .bind(format!("schedule:{id}:%"))
            .fetch_all(&mut *shard)
            .await
            .unwrap();
            all.extend(rows.into_iter().map(|r| (r.get(0), r.get(1))));
        }
        all.sort_by(|a: &(String, String), b| a.1.cmp(&b.1));
        all
    }

    /// Backends of the shards' databases waiting for a lock while running a statement that
    /// contains `needle`.
    async fn blocked_on(&mut self, needle: &str) -> i64 {
        let mut blocked = 0;
        for shard in &mut self.shards {
            let n: i64 = sqlx::query(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
                 AND wait_event_type = 'Lock' AND position($1 in query) > 0",
            )
            .bind(needle)
            .fetch_one(&mut *shard)
            .await
            .unwrap()
            .get(0);
            blocked += n;
        }
        blocked
    }

    /// Schedule `id`'s lease (its end), and its next fire time.
    async fn lease(&mut self, id: &str) -> (Option<DateTime<Utc>>, DateTime<Utc>) {
        let r = sqlx::query("SELECT lease_until, next_fire_at FROM schedules WHERE id = $1")
            .bind(id)
            .fetch_one(&mut self.conn)
            .await
            .unwrap();
        (r.get(0), r.get(1))
    }
}

/// A tenant key (acme, sessions read and write).
async fn tenant_key(c: &Cluster) -> String {
    let scopes = vec![Scope::SessionsRead, Scope::SessionsWrite];
    let (new, key) = auth::generate("acme", scopes, None, None).unwrap();
    c.store.create_key(&new).await.unwrap();
    key
}

/// A schedule firing every 2 s, each fire a session whatever the others do (no worker
/// runs them), with a catch-up window far beyond the test; its id.
async fn every_two_secs(url: &str, key: &str) -> String {
    let body = json!({
        "every_secs": EVERY_SECS,
        "overlap": "allow_all",
        "catchup_window_secs": 3600,
        "session": {"prompt": "tick"},
    });
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/schedules"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "{v}");
    v["id"].as_str().unwrap().to_string()
}

/// A cluster, the schedulers' directory, a tenant key, a reader, and a connection of the
/// test's own holding `table` locked in SHARE mode in an open transaction (until
/// [`release`]): the statement of a fire that writes `table` waits on it.
async fn locked(table: &str) -> (Cluster, PathBuf, String, Db, Vec<PgConnection>) {
    let c = Cluster::start().await;
    let dir = c.dir("schedules");
    std::fs::create_dir_all(&dir).unwrap();
    let key = tenant_key(&c).await;
    let db = Db::connect(&c).await;
    // On every shard: a fire's session is written on its own tree's.
    let mut locks = Vec::new();
    for url in c.db_url.split(',') {
        let mut lock = PgConnection::connect(url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut lock).await.unwrap();
        sqlx::query(&format!("LOCK TABLE {table} IN SHARE MODE"))
            .execute(&mut lock)
            .await
            .unwrap();
        locks.push(lock);
    }
    (c, dir, key, db, locks)
}

/// The locks [`locked`] holds, let go.
async fn release(locks: &mut [PgConnection]) {
    for lock in locks {
        sqlx::query("ROLLBACK").execute(lock).await.unwrap();
    }
}

/// Every fire of schedule `id` started one session of its own, with the fire's
/// idempotency key, and no session of the schedule is without its fire; the fire times
/// follow each other by the interval from `first`, none missing.
async fn assert_once_each(db: &mut Db, id: &str, first: DateTime<Utc>, at_least: usize) {
    let fires = db.fires(id).await;
    let sessions = db.sessions(id).await;
    assert!(fires.len() >= at_least, "{fires:#?}");
    let mut expected = first;
    for f in &fires {
        assert_eq!(
            f.time, expected,
            "a fire time missed or repeated: {fires:#?}"
        );
        assert_eq!(f.outcome, "started", "{fires:#?}");
        let made: Vec<_> = sessions
            .iter()
            .filter(|(_, k)| *k == fire_key(id, f.time))
            .collect();
        assert_eq!(made.len(), 1, "fire {}: {sessions:#?}", f.time);
        assert_eq!(f.session.as_deref(), Some(made[0].0.as_str()), "{fires:#?}");
        expected += chrono::Duration::seconds(EVERY_SECS);
    }
    assert_eq!(sessions.len(), fires.len(), "{sessions:#?} {fires:#?}");
}

/// SIGKILL between the fire's session and its record: the recording transaction is
/// blocked on a lock of `schedule_fires` the test holds, after the session was committed.
/// The next scheduler fires the same time again, gets the same session back by its
/// idempotency key, records it, and goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_between_a_fires_session_and_its_record() {
    // SHARE: the fire's INSERT waits for it; reads of the fires do not.
    let (c, dir, key, mut db, mut locks) = locked("schedule_fires").await;

    let mut a = SchedulerProc::start(&c, &dir, "scheduler-a").await;
    let id = every_two_secs(&a.url, &key).await;
    eventually(
        "a fire's session committed, its record blocked",
        T,
        async || {
            !db.sessions(&id).await.is_empty()
                && db.blocked_on("INSERT INTO schedule_fires").await > 0
        },
    )
    .await;
    a.kill();
    let made = db.sessions(&id).await;
    assert_eq!(made.len(), 1, "{made:?}");
    let (first_session, first_key) = made[0].clone();
    release(&mut locks).await;
    // The dead scheduler's transaction never commits: the fire is not recorded.
    assert!(db.fires(&id).await.is_empty());
    let (_, next) = db.lease(&id).await;
    assert_eq!(
        fire_key(&id, next),
        first_key,
        "the next fire time did not move"
    );

    let mut b = SchedulerProc::start(&c, &dir, "scheduler-b").await;
    eventually(
        "the killed fire and three after it recorded",
        T,
        async || db.fires(&id).await.len() >= 4,
    )
    .await;
    b.stop().await;
    let fires = db.fires(&id).await;
    assert_eq!(fires[0].time, next);
    assert_eq!(fires[0].session.as_deref(), Some(first_session.as_str()));
    assert_once_each(&mut db, &id, next, 4).await;
}

/// SIGKILL during the claim: the schedule is leased, and the fire's session insert is
/// blocked on a lock of `sessions` the test holds, so nothing was created. The next
/// scheduler waits out the dead one's lease, then fires that time once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduler_killed_after_its_claim_before_any_session() {
    let (c, dir, key, mut db, mut locks) = locked("sessions").await;

    let mut a = SchedulerProc::start(&c, &dir, "scheduler-a").await;
    let id = every_two_secs(&a.url, &key).await;
    eventually(
        "the schedule claimed, its session's insert blocked",
        T,
        async || db.lease(&id).await.0.is_some() && db.blocked_on("INSERT INTO sessions").await > 0,
    )
    .await;
    a.kill();
    let (lease_until, next) = db.lease(&id).await;
    let lease_until = lease_until.unwrap();
    assert!(db.sessions(&id).await.is_empty(), "nothing was created");
    assert!(db.fires(&id).await.is_empty());
    release(&mut locks).await;

    let mut b = SchedulerProc::start(&c, &dir, "scheduler-b").await;
    eventually(
        "the claimed fire and two after it recorded",
        T,
        async || db.fires(&id).await.len() >= 3,
    )
    .await;
    b.stop().await;
    let fires = db.fires(&id).await;
    assert_eq!(fires[0].time, next);
    assert!(
        fires[0].recorded_at >= lease_until,
        "taken over before the dead scheduler's lease ended: {fires:#?} {lease_until}"
    );
    assert_once_each(&mut db, &id, next, 3).await;
}
