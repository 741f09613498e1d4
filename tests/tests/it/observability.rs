//! Observability end to end, on the e2e cluster (real Redis, Postgres, `agentq worker`
//! and `agentq scheduler` processes; a fake LLM reporting known usage):
//! - the workers' scraped counters equal what the fake reported;
//! - `promtool check metrics` accepts every `/metrics` output, `promtool check rules` the
//!   alert rules;
//! - a real Prometheus scrapes a worker and the scheduler and answers a query;
//! - an SSE client that disconnects mid-session, while the worker running the session is
//!   SIGKILLed and another resumes it, reconnects with `Last-Event-ID` and ends up with
//!   exactly the stream a fresh replay of the finished session gives; `agentq watch`
//!   follows a session to its end.
//!
//! Needs `promtool` and `prometheus` (Debian package `prometheus`; `scripts/test`
//! installs it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::fs::File;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

use agentq_core::SessionStatus;
use agentq_testkit::repo_root;
use common::{Cluster, Hit, POLL, Script, Turn, WorkerOpts, agentq_bin, eventually, poll};

const T: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed on drop.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
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

/// The `AGENTQ_ADMIN_KEY` of the schedulers these tests start (and the key their clients
/// send).
const ADMIN_KEY: &str = "observability-admin-key-0123456789abcdef";

/// `agentq scheduler` on a free port; returns it and its base URL.
async fn start_scheduler(c: &Cluster, dir: &Path) -> (Proc, String) {
    start_scheduler_at(c, dir, "127.0.0.1:0").await
}

async fn start_scheduler_at(c: &Cluster, dir: &Path, addr: &str) -> (Proc, String) {
    let log = dir.join(format!("scheduler-{}.log", free_port()));
    let out = File::create(&log).unwrap();
    let child = Command::new(agentq_bin())
        .args(["scheduler", "--addr", addr, "--metrics-addr", "127.0.0.1:0"])
        .env("AGENTQ_ADMIN_KEY", ADMIN_KEY)
        .env("AGENTQ_DATABASE_URL", &c.db_url)
        .env("AGENTQ_REDIS_URL", c.redis.url())
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("spawning agentq scheduler");
    let p = Proc { child, log };
    let listening = || p.log().split("listening on ").nth(1).map(str::to_string);
    assert!(
        poll(POLL, T, async || listening().is_some()).await,
        "the scheduler did not start: {}",
        p.log()
    );
    let url = listening()
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    (p, url)
}

/// The address worker `i` serves `/metrics` on (it binds port 0 and logs the address).
async fn metrics_addr(c: &Cluster, i: usize) -> String {
    c.wait_log(i, "serving /metrics", T).await;
    let log = c.worker_log(i);
    let line = log
        .lines()
        .find(|l| l.contains("serving /metrics"))
        .unwrap();
    line.split("addr=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

async fn get_text(url: &str) -> String {
    let r = reqwest::get(url).await.unwrap();
    assert!(r.status().is_success(), "GET {url}: {}", r.status());
    r.text().await.unwrap()
}

/// Sum of the samples of `name` whose labels contain every `label="value"` in `with`.
fn sum_samples(text: &str, name: &str, with: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| with.iter().all(|w| l.contains(w)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn promtool_check_metrics(what: &str, text: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running promtool (Debian package `prometheus`; scripts/test installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics rejected the {what}'s /metrics: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn promtool_accepts_the_alert_rules_and_the_scrape_config() {
    let dir = repo_root().join("deploy/prometheus");
    for args in [
        vec!["check", "rules", "alerts.yml"],
        vec!["check", "config", "prometheus.yml"],
        // The rules' own unit tests: each alert fires on the series it is meant for.
        vec!["test", "rules", "alerts_test.yml"],
    ] {
        let out = Command::new("promtool")
            .args(&args)
            .current_dir(&dir)
            .output()
            .expect("running promtool (Debian package `prometheus`; scripts/test installs it)");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // The dashboard is JSON Grafana can import, and every query uses exported names.
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/grafana/agentq-dashboard.json")).unwrap(),
    )
    .unwrap();
    let exprs: Vec<String> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| t["expr"].as_str().unwrap().to_string())
        .collect();
    assert!(exprs.len() >= 15);
    assert!(
        exprs
            .iter()
            .any(|e| e.contains("histogram_quantile(0.99") && e.contains("agentq_llm_request"))
    );
    for e in &exprs {
        for word in e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if let Some(name) = word.strip_prefix("agentq_") {
                let base = name
                    .trim_end_matches("_bucket")
                    .trim_end_matches("_sum")
                    .trim_end_matches("_count");
                let src = [
                    include_str!("../../../core/src/metrics.rs"),
                    include_str!("../../../core/src/metrics/families.rs"),
                ];
                assert!(
                    src.iter()
                        .any(|s| s.contains(&format!("\"agentq_{base}\""))),
                    "the dashboard queries agentq_{name}, which core/src/metrics/ does not define"
                );
            }
        }
    }
}

/// N sessions over two workers: the tokens and iterations the workers export add up to
/// what the fake LLM reported and the number of LLM responses; promtool accepts every
/// `/metrics`; a real Prometheus scrapes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn scraped_counters_equal_what_the_fake_reported() {
    let mut c = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let w0 = c.spawn_ready_worker(&WorkerOpts::default()).await;
    let w1 = c.spawn_ready_worker(&WorkerOpts::default()).await;
    let addrs = [metrics_addr(&c, w0).await, metrics_addr(&c, w1).await];
    let (_sched, api) = start_scheduler(&c, dir.path()).await;

    const N: usize = 8;
    let subs = c
        .submit_many((0..N).map(|_| Script::two_turns()).collect())
        .await;
    let ids: Vec<String> = subs.iter().map(|s| s.id.clone()).collect();
    let rows = c.wait_all_terminal(&ids, T).await;
    assert!(
        rows.iter().all(|r| r.status == SessionStatus::Completed),
        "{rows:?}"
    );

    // What the fake reported: turn t answers with usage 100 + t input, 10 output tokens.
    let turns: Vec<usize> = c
        .hits()
        .into_iter()
        .filter_map(|h| match h {
            Hit::Llm { token, turn } if subs.iter().any(|s| s.token == token) => Some(turn),
            _ => None,
        })
        .collect();
    assert_eq!(turns.len(), 2 * N, "one request per turn: {turns:?}");
    let input: f64 = turns.iter().map(|t| 100.0 + *t as f64).sum();
    let output = 10.0 * turns.len() as f64;
    // Committed LLM responses, from the store.
    let mut responses = 0usize;
    for s in &subs {
        responses += c
            .store
            .messages(&s.id)
            .await
            .unwrap()
            .iter()
            .filter(|m| m.role == agentq_agent::schema::Role::Assistant)
            .count();
    }
    assert_eq!(responses, 2 * N);

    // The finished-session counter moves right after the terminal commit: poll briefly.
    let mut texts = Vec::new();
    let want = (
        input,
        output,
        responses as f64,
        N as f64,
        turns.len() as f64,
    );
    let mut got = Default::default();
    let settled = poll(
        Duration::from_millis(100),
        Duration::from_secs(10),
        async || {
            texts.clear();
            for a in &addrs {
                texts.push(get_text(&format!("http://{a}/metrics")).await);
            }
            let sum = |name: &str, with: &[&str]| -> f64 {
                texts.iter().map(|t| sum_samples(t, name, with)).sum()
            };
            got = (
                sum("agentq_llm_tokens_total", &["type=\"input\""]),
                sum("agentq_llm_tokens_total", &["type=\"output\""]),
                sum("agentq_iterations_total", &[]),
                sum(
                    "agentq_sessions_finished_total",
                    &["finish_reason=\"stop\""],
                ),
                sum("agentq_llm_requests_total", &["outcome=\"ok\""]),
            );
            got == want
        },
    )
    .await;
    assert!(
        settled,
        "scraped (input, output, iterations, finished, ok requests) {got:?} != {want:?}"
    );
    for t in &texts {
        assert!(
            t.contains(
                "agentq_llm_tokens_total{model=\"gpt-test\",provider=\"openai\",type=\"input\"}"
            ) || !t.contains("agentq_iterations_total{"),
            "labels: {t}"
        );
        assert!(
            !ids.iter().any(|id| t.contains(id.as_str())),
            "a session id in a label"
        );
    }

    // The scheduler's queue gauges, read from XINFO at the scrape, on its own port: the
    // API's answers 404 there.
    assert_eq!(
        reqwest::get(format!("{api}/metrics"))
            .await
            .unwrap()
            .status(),
        404
    );
    let sched_metrics = _sched
        .log()
        .split("/metrics on ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("the scheduler logs its /metrics address")
        .to_string();
    let sched = get_text(&format!("{sched_metrics}/metrics")).await;
    assert!(
        sched.contains("agentq_queue_length{queue=\"default\"}"),
        "{sched}"
    );
    assert!(
        sched.contains("agentq_queue_pending{queue=\"default\"} 0"),
        "{sched}"
    );
    assert!(
        sched.contains("agentq_queue_lag{queue=\"default\"} 0"),
        "{sched}"
    );
    assert!(sched.contains("agentq_build_info{version="), "{sched}");

    for (i, t) in texts.iter().enumerate() {
        promtool_check_metrics(&format!("worker {i}"), t);
    }
    promtool_check_metrics("scheduler", &sched);

    // A real Prometheus scraping both workers and the scheduler every second.
    let port = free_port();
    let config = dir.path().join("prometheus.yml");
    let sched_target = sched_metrics.trim_start_matches("http://").to_string();
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n\
             \x20 - job_name: agentq-worker\n    static_configs:\n      - targets: [\"{}\", \"{}\"]\n\
             \x20 - job_name: agentq-scheduler\n    static_configs:\n      - targets: [\"{sched_target}\"]\n",
            addrs[0], addrs[1]
        ),
    )
    .unwrap();
    let log = dir.path().join("prometheus.log");
    let out = File::create(&log).unwrap();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("tsdb").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("running prometheus (Debian package `prometheus`; scripts/test installs it)");
    let _prom = Proc { child, log };
    let query = |q: &'static str| {
        let url = format!("http://127.0.0.1:{port}/api/v1/query");
        async move {
            let r = reqwest::Client::new()
                .get(url)
                .query(&[("query", q)])
                .send()
                .await
                .ok()?;
            let v: Value = r.json().await.ok()?;
            (v["status"] == "success").then(|| v["data"]["result"].as_array().cloned())?
        }
    };
    eventually(
        "Prometheus answers agentq_iterations_total",
        Duration::from_secs(60),
        async || {
            let Some(result) = query("sum(agentq_iterations_total)").await else {
                return false;
            };
            result
                .first()
                .and_then(|r| r["value"][1].as_str()?.parse::<f64>().ok())
                == Some(responses as f64)
        },
    )
    .await;
    eventually("every target is up", Duration::from_secs(30), async || {
        let Some(result) = query("up").await else {
            return false;
        };
        result.len() == 3 && result.iter().all(|r| r["value"][1] == "1")
    })
    .await;
    let lag = query("agentq_queue_lag").await.unwrap();
    assert_eq!(lag.len(), 1, "{lag:?}");
    assert_eq!(lag[0]["metric"]["queue"], "default");
}

// ---------------------------------------------------------------------------------------
// SSE
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
struct Ev {
    id: Option<String>,
    event: String,
    data: Value,
}

struct Sse {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: String,
}

impl Sse {
    async fn connect(api: &str, id: &str, last: Option<&str>) -> Sse {
        let mut req = reqwest::Client::new()
            .get(format!("{api}/v1/sessions/{id}/events"))
            .bearer_auth(ADMIN_KEY);
        if let Some(l) = last {
            req = req.header("last-event-id", l);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        Sse {
            body: Box::pin(resp.bytes_stream()),
            buf: String::new(),
        }
    }

    /// The next event; `None` when the server ends the stream.
    async fn next(&mut self) -> Option<Ev> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut ev = Ev {
                    id: None,
                    event: "message".into(),
                    data: Value::Null,
                };
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("id: ") {
                        ev.id = Some(v.into());
                    } else if let Some(v) = line.strip_prefix("event: ") {
                        ev.event = v.into();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if data.is_empty() {
                    continue; // keep-alive
                }
                ev.data = serde_json::from_str(&data).unwrap();
                return Some(ev);
            }
            let chunk = tokio::time::timeout(T, self.body.next())
                .await
                .expect("no event within a minute");
            match chunk {
                Some(Ok(b)) => self.buf.push_str(&String::from_utf8_lossy(&b)),
                _ => return None,
            }
        }
    }

    async fn until(&mut self, out: &mut Vec<Ev>, mut stop: impl FnMut(&[Ev]) -> bool) {
        while !stop(out) {
            out.push(self.next().await.expect("the stream ended early"));
        }
    }

    async fn read_to_end(&mut self, out: &mut Vec<Ev>) {
        while let Some(e) = self.next().await {
            out.push(e);
        }
    }
}

/// What a client holds after applying `reset`s: events of positions ≥ `seq` dropped.
fn apply_resets(events: &[Ev]) -> Vec<Ev> {
    let mut held: Vec<Ev> = Vec::new();
    for e in events {
        if e.event == "reset" {
            let s = e.data["seq"].as_u64().unwrap();
            held.retain(|x| x.data["seq"].as_u64().unwrap() < s);
        } else {
            held.push(e.clone());
        }
    }
    held
}

fn stream_id(id: &str) -> (u64, u64) {
    let (a, b) = id.split_once('-').unwrap();
    (a.parse().unwrap(), b.parse().unwrap())
}

fn assert_ids_increase(events: &[Ev]) {
    let ids: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|e| e.id.as_deref())
        .map(stream_id)
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "ids not strictly increasing: {ids:?}"
    );
}

/// Four slow turns with tool calls: long enough to disconnect and kill inside.
fn slow_script() -> Script {
    let mut s = Script::new(vec![
        Turn::gets("Fetching the first page.", &["p1"]),
        Turn::gets("Fetching the second page.", &["p2"]),
        Turn::gets("Fetching the third page.", &["p3"]),
        Turn::text("All three pages say ok."),
    ]);
    s.chunk_delay = Duration::from_millis(150);
    s
}

/// Session A's client disconnects mid-turn (it has seen deltas of a step that will be
/// thrown away); B's right after a committed turn. Then the worker is SIGKILLed and
/// another one resumes both sessions. A's client reconnects with `Last-Event-ID` at once
/// and follows the handover live (it must be told to drop the abandoned step: `reset`);
/// B's reconnects after the end and must get exactly the rest, with no reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sse_resumes_across_a_worker_kill() {
    let mut c = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_sched, api) = start_scheduler(&c, dir.path()).await;
    let w0 = c.spawn_ready_worker(&WorkerOpts::default()).await;
    // A's second answer (the fake's turn 1) streams slowly the first time, so that the kill
    // lands inside it however late a loaded machine relays its first delta.
    let mut slow_a = slow_script();
    slow_a.slow_once.insert(1, Duration::from_secs(2));
    let subs = c.submit_many(vec![slow_a, slow_script()]).await;
    let (a, b) = (&subs[0], &subs[1]);

    let mut sse_a = Sse::connect(&api, &a.id, None).await;
    let mut sse_b = Sse::connect(&api, &b.id, None).await;
    let (mut got_a, mut got_b) = (Vec::new(), Vec::new());
    // B: up to the first committed turn.
    sse_b
        .until(&mut got_b, |evs| {
            evs.last().is_some_and(|e| e.event == "iteration_completed")
        })
        .await;
    drop(sse_b);
    // A: into the streaming of its second answer (iteration 2's first text delta).
    sse_a
        .until(&mut got_a, |evs| {
            let start = evs
                .iter()
                .position(|e| e.event == "iteration_started" && e.data["iteration"] == 2);
            start.is_some_and(|p| evs[p..].iter().any(|e| e.event == "text_delta"))
        })
        .await;
    drop(sse_a);
    let seen_a = got_a.len();
    c.kill_worker(w0);
    let _w1 = c.spawn_ready_worker(&WorkerOpts::default()).await;

    // A reconnects at once and follows the handover live; B comes back only after both
    // sessions finished, and catches up in one replay.
    let last_a = got_a.iter().rev().find_map(|e| e.id.clone()).unwrap();
    let last_b = got_b.iter().rev().find_map(|e| e.id.clone()).unwrap();
    let mut sse_a = Sse::connect(&api, &a.id, Some(&last_a)).await;
    sse_a.read_to_end(&mut got_a).await;
    let rows = c.wait_all_terminal(&[a.id.clone(), b.id.clone()], T).await;
    assert!(
        rows.iter().all(|r| r.status == SessionStatus::Completed),
        "{rows:?}"
    );
    let mut sse_b = Sse::connect(&api, &b.id, Some(&last_b)).await;
    sse_b.read_to_end(&mut got_b).await;

    // The kill really interrupted A's second LLM call (iteration 2, the fake's turn 1):
    // it was asked again.
    assert_eq!(c.llm_requests(a, 1), 2, "A's turn 1 re-issued");

    for (sub, got, must_reset) in [(a, &got_a, true), (b, &got_b, false)] {
        let mut fresh = Sse::connect(&api, &sub.id, None).await;
        let mut replay = Vec::new();
        fresh.read_to_end(&mut replay).await;

        assert_ids_increase(got);
        assert_ids_increase(&replay);
        let resets = got.iter().filter(|e| e.event == "reset").count();
        if must_reset {
            // A held deltas of the abandoned step: it was told to drop them.
            assert!(resets >= 1, "no reset for A: {got:#?}");
            assert!(got[..seen_a].iter().all(|e| e.event != "reset"));
        } else {
            assert_eq!(resets, 0, "B saw only committed work: {got:#?}");
            assert_eq!(got, &replay, "B's concatenation differs from the replay");
        }
        assert_eq!(
            apply_resets(got),
            replay,
            "the resumed stream of {} differs from a fresh replay",
            sub.id
        );

        // Exactly one completion, carrying the final answer, which is also the text
        // streamed for the last position.
        let completions: Vec<&Ev> = replay
            .iter()
            .filter(|e| e.event == "session_completed")
            .collect();
        assert_eq!(completions.len(), 1);
        assert_eq!(replay.last().unwrap().event, "session_completed");
        let messages = c.store.messages(&sub.id).await.unwrap();
        let last = messages.len() - 1;
        let final_text = &messages[last].content;
        assert_eq!(final_text, "All three pages say ok.");
        assert_eq!(
            completions[0].data["result"].as_str(),
            Some(final_text.as_str())
        );
        let streamed: String = replay
            .iter()
            .filter(|e| e.event == "text_delta" && e.data["seq"] == last)
            .map(|e| e.data["text"].as_str().unwrap())
            .collect();
        assert_eq!(&streamed, final_text);
        // Every stored tool result appears once.
        let results = replay.iter().filter(|e| e.event == "tool_result").count();
        assert_eq!(results, 3);
    }

    // `agentq watch` follows a finished session from the start and exits 0.
    let out = tokio::task::spawn_blocking({
        let api = api.clone();
        let id = a.id.clone();
        move || {
            Command::new(agentq_bin())
                .args(["watch", &id, "--api-url", &api])
                .env("AGENTQ_API_KEY", ADMIN_KEY)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "agentq watch: {out:?}");
    assert!(stdout.contains("All three pages say ok."), "{stdout}");
    assert!(stdout.contains("→ http_fetch("), "{stdout}");
    assert!(stdout.contains("[session finished: stop;"), "{stdout}");
}

/// `agentq watch` keeps following a running session across a scheduler restart: it
/// reconnects with `Last-Event-ID`, prints every turn once, and exits 0 at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watch_survives_a_scheduler_restart() {
    let mut c = Cluster::start().await;
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let (sched, api) = start_scheduler_at(&c, dir.path(), &addr).await;
    c.spawn_ready_worker(&WorkerOpts::default()).await;
    let sub = c.submit(slow_script()).await;

    let out_path = dir.path().join("watch.out");
    let mut watch = Command::new(agentq_bin())
        .args(["watch", &sub.id, "--api-url", &api])
        .env("AGENTQ_API_KEY", ADMIN_KEY)
        .stdout(File::create(&out_path).unwrap())
        .stderr(File::create(dir.path().join("watch.err")).unwrap())
        .spawn()
        .unwrap();
    let printed = || std::fs::read_to_string(&out_path).unwrap_or_default();
    eventually("watch prints the first answer", T, async || {
        printed().contains("Fetching the first page.")
    })
    .await;
    drop(sched);
    // Back once `watch` has seen it go (and said it reconnects).
    let said = || std::fs::read_to_string(dir.path().join("watch.err")).unwrap_or_default();
    eventually("watch to notice the scheduler gone", T, async || {
        said().contains("reconnecting")
    })
    .await;
    let (_sched, _) = start_scheduler_at(&c, dir.path(), &addr).await;

    let mut status = None;
    let finished = poll(POLL, T, async || {
        status = watch.try_wait().unwrap();
        status.is_some()
    })
    .await;
    assert!(finished, "watch did not finish: {}", printed());
    let status = status.unwrap();
    let out = printed();
    let err = std::fs::read_to_string(dir.path().join("watch.err")).unwrap_or_default();
    assert!(status.success(), "watch failed: {out}\n{err}");
    assert!(err.contains("reconnecting"), "it never reconnected: {err}");
    for text in [
        "Fetching the first page.",
        "Fetching the second page.",
        "Fetching the third page.",
        "All three pages say ok.",
    ] {
        assert_eq!(out.matches(text).count(), 1, "{text:?} in {out}");
    }
    assert_eq!(out.matches("→ http_fetch(").count(), 3, "{out}");
    assert!(
        out.contains("[session finished: stop; 4 iterations;"),
        "{out}"
    );
}
