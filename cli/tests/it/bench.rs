#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `agentq bench` end to end, small: it starts its own Redis and durable Postgres
//! (`--private`), runs five parts and prints one JSON object on its last line. Performance
//! is measured, never asserted: only that every figure is there and makes sense.

use std::process::Command;
use std::time::{Duration, Instant};

use agentq_testkit::{PostgresOptions, PostgresServer, RedisServer};

/// `agentq bench ARGS` on servers of its own (`--private` among the args; the
/// environment's URLs removed), which must succeed: the JSON object of its last line, and
/// its whole standard output.
fn private_bench(args: &[&str]) -> (serde_json::Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args(args)
        .env_remove("AGENTQ_DATABASE_URL")
        .env_remove("AGENTQ_REDIS_URL")
        .output()
        .expect("running agentq bench");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let v = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    (v, stdout)
}

/// Each of `keys` in `v` is a finite number above zero.
fn assert_positive(v: &serde_json::Value, keys: &[&str]) {
    for key in keys {
        let x = v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"));
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
}

#[test]
fn bench_prints_every_figure_as_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args([
            "bench",
            "--private",
            // Four sessions: the storage and resume parts run 160 iterations per session
            // asked for (at most 50), which at 20 took most of this test's time.
            "--sessions",
            "4",
            "--iterations",
            "3",
            "--only",
            "ceiling,throughput,overhead,storage,resume",
            "--ceiling-secs",
            "1",
            "--json",
        ])
        .env_remove("AGENTQ_DATABASE_URL")
        .env_remove("AGENTQ_REDIS_URL")
        .output()
        .expect("running agentq bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "agentq bench failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().expect("no output");
    let v: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(v["tool"], "trivial");

    let positive = |key: &str| {
        let x = v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"));
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    };
    for key in [
        "ceiling_commits_per_s",
        "ceiling_redis_roundtrips_per_s",
        "iterations_per_s",
        // The warm-up round, run before the measured one on the same workers.
        "iterations_per_s_cold",
        "ratio_to_ceiling",
        "overhead_p50_ms",
        "overhead_p99_ms",
        // One session alone on the workers.
        "overhead_alone_p50_ms",
        "overhead_alone_p99_ms",
        // The machine's floor under it, measured in the same part.
        "lone_commit_p50_ms",
        "lone_commit_p99_ms",
        "overhead_alone_in_commits",
        "resume_ms",
        // The ceiling keeps both cores busy for a second: its CPU cannot round to zero.
        "ceiling_cpu_ms_per_commit",
    ] {
        positive(key);
    }
    // A private Postgres runs on this machine, so its CPU is found; Redis reports its own.
    for key in [
        "worker_cpu_ms_per_iteration",
        "postgres_cpu_ms_per_iteration",
        "redis_cpu_ms_per_iteration",
        "iteration_cpu_in_ceiling_commits",
    ] {
        let x = v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"));
        assert!(x.is_finite() && x >= 0.0, "{key} = {x}");
    }
    for k in ["10", "40", "160"] {
        let x = v["bytes_per_iteration"][k]
            .as_f64()
            .unwrap_or_else(|| panic!("bytes_per_iteration.{k} missing in {v}"));
        assert!(x.is_finite() && x > 0.0, "bytes_per_iteration.{k} = {x}");
    }
    // Parts that did not run are present, as null.
    for key in [
        "capacity_sessions",
        "capacity_iterations_per_s",
        "capacity_rss_bytes",
        "capacity_ramp_s",
        "capacity_iterations_per_session",
        "recovery_s",
    ] {
        assert!(v.get(key).is_some_and(|x| x.is_null()), "{key} in {v}");
    }
    assert_eq!(v["throughput_failed_sessions"], 0, "{v}");
    // The human table comes first.
    assert!(stdout.contains("ceiling"), "{stdout}");
}

/// `--tool mcp`, tiny: the throughput part runs the trivial tool and the MCP tool (served
/// by `agentq bench-mcp-server`, one per worker) in the same run. Both rates and the
/// overhead per MCP call are reported, and the servers answered exactly the calls the
/// sessions made (warm-up rounds included): the MCP figure is not that of failed calls.
#[test]
fn bench_throughput_with_an_mcp_tool_reports_both_rates_and_the_calls_served() {
    let (sessions, iterations, pairs) = (12u64, 4u64, 2u64);
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args(["bench", "--private", "--only", "throughput", "--json"])
        .args(["--tool", "mcp", "--mcp-pairs", &pairs.to_string()])
        .args(["--sessions", &sessions.to_string()])
        .args(["--iterations", &iterations.to_string()])
        .args([
            "--workers",
            "2",
            "--concurrency",
            "8",
            "--ceiling-secs",
            "0.3",
        ])
        .env_remove("AGENTQ_DATABASE_URL")
        .env_remove("AGENTQ_REDIS_URL")
        .output()
        .expect("running agentq bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "agentq bench failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().expect("no output");
    let v: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(v["tool"], "mcp", "{v}");
    assert_eq!(v["mcp_builtin_tool"], "trivial", "{v}");
    assert_eq!(v["mcp_pairs"], pairs, "{v}");
    for key in [
        "iterations_per_s",
        "mcp_iterations_per_s",
        "mcp_builtin_iterations_per_s",
    ] {
        let x = v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"));
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
    // Noise may make it negative on a tiny run: it is a number, not a sign.
    let overhead = v["mcp_overhead_ms_per_call"]
        .as_f64()
        .unwrap_or_else(|| panic!("mcp_overhead_ms_per_call in {v}"));
    assert!(overhead.is_finite(), "{overhead}");
    // The servers are this process's children on this machine: their CPU is found.
    let server_cpu = v["mcp_server_cpu_ms_per_call"]
        .as_f64()
        .unwrap_or_else(|| panic!("mcp_server_cpu_ms_per_call in {v}"));
    assert!(server_cpu.is_finite() && server_cpu >= 0.0, "{server_cpu}");
    let client_cpu = v["mcp_client_cpu_ms_per_call"]
        .as_f64()
        .unwrap_or_else(|| panic!("mcp_client_cpu_ms_per_call in {v}"));
    assert!(client_cpu.is_finite(), "{client_cpu}");
    assert_eq!(v["mcp_calls_per_iteration"], 0.75, "{v}");
    // Every turn but the last calls the tool; each MCP round has a warm-up round too.
    let made = pairs * 2 * sessions * (iterations - 1);
    assert_eq!(v["mcp_calls_made"], made, "{v}");
    assert_eq!(v["mcp_calls_served"], made, "{v}");
    assert_eq!(v["throughput_failed_sessions"], 0, "{v}");
    // Pairs alternate their order, and each round is reported.
    let rounds: Vec<&str> = v["mcp_rounds"]
        .as_array()
        .unwrap_or_else(|| panic!("mcp_rounds in {v}"))
        .iter()
        .map(|r| r["tool"].as_str().expect("a tool"))
        .collect();
    assert_eq!(
        rounds,
        [
            "trivial",
            "mcp__bench__list_dir",
            "mcp__bench__list_dir",
            "trivial"
        ]
    );
    assert!(stdout.contains("overhead per MCP call"), "{stdout}");
}

#[test]
fn an_mcp_run_without_a_call_to_measure_is_refused_naming_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args(["bench", "--private", "--tool", "mcp", "--iterations", "1"])
        .output()
        .expect("running agentq bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--iterations"), "{stderr}");
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args(["bench", "--private", "--mcp-pairs", "3"])
        .output()
        .expect("running agentq bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--mcp-pairs"), "{stderr}");
}

/// The server's subcommand is for the bench: not in the binary's help.
#[test]
fn the_mcp_server_subcommand_is_hidden() {
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .arg("--help")
        .output()
        .expect("running agentq --help");
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("bench"), "{help}");
    assert!(!help.contains("bench-mcp-server"), "{help}");
}

#[test]
fn an_unknown_tool_is_refused_naming_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args(["bench", "--private", "--tool", "shell"])
        .output()
        .expect("running agentq bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--tool"), "{stderr}");
    assert!(
        stderr.contains("trivial") && stderr.contains("list_dir") && stderr.contains("mcp"),
        "{stderr}"
    );
}

#[test]
fn an_unknown_hostile_kind_is_refused_naming_the_flag_and_the_kinds() {
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args(["bench", "--private", "--only", "isolation"])
        .args(["--hostile", "spin,bomb"])
        .output()
        .expect("running agentq bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--hostile"), "{stderr}");
    for kind in ["nul", "edit_bomb", "big_output", "spin", "huge_timeout"] {
        assert!(stderr.contains(kind), "{kind} not named: {stderr}");
    }
}

/// A stock Postgres accepts 100 connections; the default run (2 workers at concurrency 256,
/// whose pools `agentq worker` would size to 64 + 3 connections each) fits into that by
/// sharing them, says so naming `--concurrency`, and runs the parts with worker processes
/// too, instead of waiting half a minute for refused connections. Its capacity part's
/// worker process is configured for HTTP/2 from the environment, as a deployment would be.
#[test]
fn a_stock_postgres_runs_the_defaults_in_the_connections_it_has() {
    let pg = PostgresServer::start_with(PostgresOptions {
        max_connections: 100,
        ..PostgresOptions::default()
    })
    .expect("starting Postgres");
    let redis = RedisServer::start().expect("starting Redis");
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args(["bench", "--database-url", &pg.database_url("postgres")])
        .args(["--redis-url", &redis.url()])
        .args([
            "--sessions",
            "20",
            "--iterations",
            "3",
            "--ceiling-secs",
            "1",
        ])
        .args(["--only", "ceiling,throughput,capacity,recovery"])
        .args(["--capacity-sessions", "40", "--llm-latency-ms", "50"])
        .args(["--capacity-secs", "2", "--json"])
        // The worker process inherits these: its calls go over HTTP/2, eight to a
        // connection.
        .env("AGENTQ_PROVIDERS_HTTP", "http2")
        .env("AGENTQ_PROVIDERS_STREAMS_PER_CONNECTION", "8")
        .env_remove("AGENTQ_DATABASE_URL")
        .env_remove("AGENTQ_REDIS_URL")
        .output()
        .expect("running agentq bench");
    let elapsed = started.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("timed out"), "{stderr}");
    assert!(
        out.status.success(),
        "agentq bench failed after {elapsed:?} ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("--concurrency") && stderr.contains("max_connections 100"),
        "no notice of the smaller pools: {stderr}"
    );
    let last = stdout.lines().last().expect("no output");
    let v: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    let conns = v["ceiling_connections"]
        .as_u64()
        .expect("ceiling_connections");
    assert!((8..=97).contains(&conns), "ceiling_connections = {conns}");
    assert_eq!(v["throughput_failed_sessions"], 0, "{v}");
    for key in [
        "ceiling_commits_per_s",
        "iterations_per_s",
        "capacity_iterations_per_s",
        "capacity_ramp_s",
        "capacity_iterations_per_session",
        "recovery_s",
    ] {
        let x = v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing in {v}"));
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
    // Every offered session was in flight at once on the worker process, its calls on
    // HTTP/2.
    assert_eq!(v["capacity_sessions"], 40, "{v}");
    assert_eq!(v["capacity_http2"], true, "{v}");
}

/// Too few connections for even the smallest pools: refused before any part runs, naming
/// the flags that fit the run to the server.
#[test]
fn too_few_postgres_connections_are_refused_at_once_naming_concurrency() {
    let pg = PostgresServer::start_with(PostgresOptions {
        max_connections: 100,
        ..PostgresOptions::default()
    })
    .expect("starting Postgres");
    let redis = RedisServer::start().expect("starting Redis");
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args(["bench", "--database-url", &pg.database_url("postgres")])
        .args(["--redis-url", &redis.url(), "--workers", "16"])
        .args(["--only", "throughput"])
        .env_remove("AGENTQ_DATABASE_URL")
        .env_remove("AGENTQ_REDIS_URL")
        .output()
        .expect("running agentq bench");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("--concurrency") && stderr.contains("--workers"),
        "{stderr}"
    );
    assert!(!stderr.contains("timed out"), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refused only after {:?}",
        started.elapsed()
    );
}

/// The isolation part, tiny: bystanders alone and beside hostile sessions of `kinds` on the
/// same workers. Its JSON, and that no bystander failed (the run would exit non-zero).
fn isolation_run(kinds: Option<&str>) -> serde_json::Value {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agentq"));
    cmd.args(["bench", "--private", "--only", "isolation", "--json"])
        .args(["--sessions", "18", "--iterations", "3", "--workers", "2"])
        .args(["--concurrency", "16", "--hostile-percent", "25"])
        .args(["--hostile-bytes", "200000"])
        .env_remove("AGENTQ_DATABASE_URL")
        .env_remove("AGENTQ_REDIS_URL");
    if let Some(kinds) = kinds {
        cmd.args(["--hostile", kinds]);
    }
    let out = cmd.output().expect("running agentq bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "agentq bench failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().expect("no output");
    let v: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(v["isolation_bystanders"], 18, "{v}");
    // 25 % of all sessions: 6 beside 18.
    assert_eq!(v["isolation_hostiles"], 6, "{v}");
    for key in [
        "isolation_alone_iterations_per_s",
        "isolation_control_iterations_per_s",
        "isolation_mixed_iterations_per_s",
        "isolation_ratio",
        "isolation_ratio_vs_alone",
    ] {
        let x = v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"));
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
    assert_eq!(v["isolation_bystanders_failed"], 0, "{v}");
    // Every hostile session is accounted for, by kind and outcome.
    let by_kind = v["isolation_hostile_outcomes"]
        .as_object()
        .unwrap_or_else(|| panic!("isolation_hostile_outcomes in {v}"));
    let kinds: Vec<&str> = v["isolation_hostile_kinds"]
        .as_array()
        .expect("isolation_hostile_kinds")
        .iter()
        .map(|k| k.as_str().expect("a kind name"))
        .collect();
    let mut named: Vec<&str> = by_kind.keys().map(String::as_str).collect();
    named.sort_unstable();
    let mut want = kinds.clone();
    want.sort_unstable();
    assert_eq!(named, want, "{v}");
    let total: u64 = by_kind
        .values()
        .flat_map(|o| o.as_object().expect("outcomes").values())
        .map(|n| n.as_u64().expect("a count"))
        .sum();
    assert_eq!(total, 6, "{v}");
    let sum = ["completed", "failed", "unfinished"]
        .iter()
        .map(|k| v[format!("isolation_hostiles_{k}")].as_u64().expect(k))
        .sum::<u64>();
    assert_eq!(sum, 6, "{v}");
    // Other parts did not run.
    assert!(v["iterations_per_s"].is_null(), "{v}");
    assert!(stdout.contains("isolation"), "{stdout}");
    v
}

/// The kinds that today's build survives: a spinning loop and big outputs. A spin session
/// ends at its iteration limit, never completed.
#[test]
fn bench_isolation_prints_bystanders_beside_hostile_sessions_as_json() {
    let v = isolation_run(Some("spin,big_output"));
    assert_eq!(
        v["isolation_hostile_kinds"],
        serde_json::json!(["big_output", "spin"])
    );
    let spin = v["isolation_hostile_outcomes"]["spin"]
        .as_object()
        .expect("spin outcomes");
    assert!(!spin.contains_key("completed"), "{v}");
}

/// Every kind, the default: NUL in model output, the edit bomb and the huge timeout as
/// well, which only a build that isolates them survives with every bystander completed.
#[test]
fn bench_isolation_survives_every_hostile_kind() {
    let v = isolation_run(None);
    assert_eq!(
        v["isolation_hostile_kinds"].as_array().map(Vec::len),
        Some(5)
    );
    assert_eq!(v["isolation_hostiles_unfinished"], 0, "{v}");
}

/// The admission part, small: three short rounds of `agentq worker` children against the
/// rate-limited fake. Every figure is there and in range (the targets are the bench's, not
/// this test's).
#[test]
fn bench_admission_prints_the_limiter_figures_as_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args(["bench", "--private", "--only", "admission", "--json"])
        .args(["--admission-rpm", "600", "--admission-sessions", "8"])
        .args(["--admission-secs", "2"])
        .env_remove("AGENTQ_DATABASE_URL")
        .env_remove("AGENTQ_REDIS_URL")
        .output()
        .expect("running agentq bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "agentq bench failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().expect("no output");
    let v: serde_json::Value = serde_json::from_str(last).expect("the last line is JSON");
    assert_eq!(v["admission_rpm"], 600, "{v}");
    let num = |key: &str| {
        v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing or not a number in {v}"))
    };
    for key in [
        "admission_iterations_per_s",
        "admission_limit_ratio",
        "admission_nonbinding_iterations_per_s",
        "admission_unlimited_iterations_per_s",
        "admission_nonbinding_ratio",
    ] {
        let x = num(key);
        assert!(x.is_finite() && x > 0.0, "{key} = {x}");
    }
    let share = num("admission_refused_share");
    assert!((0.0..=1.0).contains(&share), "{share}");
    let calls = num("admission_redis_calls_per_call");
    assert!(calls.is_finite() && calls >= 0.0, "{calls}");
    assert!(num("admission_redis_commands_added_per_iteration").is_finite());
    // Other parts did not run.
    assert!(v["iterations_per_s"].is_null(), "{v}");
    assert!(stdout.contains("admission"), "{stdout}");
}

#[test]
fn an_admission_limit_of_zero_is_refused_naming_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args(["bench", "--private", "--only", "admission"])
        .args(["--admission-rpm", "0"])
        .output()
        .expect("running agentq bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--admission-rpm"), "{stderr}");
}

#[test]
fn bench_workspace_resumes_cold_and_warm() {
    let (v, stdout) = private_bench(&[
        "bench",
        "--private",
        "--only",
        "workspace",
        "--workspace-files",
        "50",
        "--workspace-mb",
        "2",
        "--json",
    ]);
    assert_eq!(v["workspace_files"], 50, "{v}");
    assert_eq!(v["workspace_bytes"], 2_000_000, "{v}");
    assert_positive(
        &v,
        &[
            "workspace_resume_cold_ms",
            "workspace_resume_warm_ms",
            "workspace_round_nofile_commits",
            "workspace_round_nofile_rows",
            "workspace_round_write_commits",
            "workspace_round_write_rows",
            "workspace_round_write_bytes",
        ],
    );

    assert!(stdout.contains("workspace"), "{stdout}");
}

/// The scale part: one tenant's budget holds, the WAL of a lease renewal, the limiter's
/// calls on the private Redis and on a 3-master cluster it starts, and the workload on one
/// Postgres and two shards, on one Redis and the cluster (each shard given sessions, every
/// session completed, or the part fails); every figure is there.
#[test]
fn bench_scale_measures_budget_holds_leases_and_the_limiter_on_a_cluster() {
    let (v, stdout) = private_bench(&[
        "bench",
        "--private",
        "--only",
        "scale",
        "--scale-calls",
        "128",
        "--scale-rounds",
        "2",
        "--sessions",
        "20",
        "--iterations",
        "3",
        "--json",
    ]);
    let layouts = v["scale_routing_iterations_per_s"]
        .as_object()
        .unwrap_or_else(|| panic!("scale_routing_iterations_per_s in {v}"));
    let names: Vec<&str> = layouts.keys().map(String::as_str).collect();
    for layout in [
        "1 Postgres, 1 Redis",
        "2 shards in 1 Postgres, 1 Redis",
        "1 Postgres, cluster of 1 node",
        "2 Postgres shards, 1 Redis",
        "1 Postgres, 3-master cluster",
        "2 Postgres shards, 3-master cluster",
    ] {
        let rounds = layouts[layout]
            .as_array()
            .unwrap_or_else(|| panic!("{layout} in {names:?}"));
        assert_eq!(rounds.len(), 2, "{layout}: {rounds:?}");
        for x in rounds {
            assert!(x.as_f64().is_some_and(|x| x > 0.0), "{layout}: {rounds:?}");
        }
        assert!(stdout.contains(layout), "{stdout}");
    }
    assert_positive(
        &v,
        &[
            "scale_budget_holds_per_s",
            "scale_budget_hold_p50_ms",
            "scale_heartbeat_wal_bytes_per_lease",
            "scale_limiter_calls_per_s",
            "scale_limiter_one_node_calls_per_s",
            "scale_limiter_cluster_calls_per_s",
        ],
    );
    assert!(stdout.contains("3-master cluster"), "{stdout}");
}

/// `--baseline`: the same parts run with another binary and this one alternately, each on a
/// fresh database of the same private servers, figures reported as ratios. Against itself
/// every figure is there for both builds and every ratio is a positive number.
#[test]
fn bench_against_a_baseline_reports_each_figure_as_a_ratio() {
    let exe = env!("CARGO_BIN_EXE_agentq");
    let out = Command::new(exe)
        .args([
            "bench",
            "--baseline",
            exe,
            "--pairs",
            "2",
            "--private",
            "--only",
            "ceiling",
            "--ceiling-secs",
            "0.3",
            "--json",
        ])
        .env_remove("AGENTQ_DATABASE_URL")
        .env_remove("AGENTQ_REDIS_URL")
        .output()
        .expect("running agentq bench --baseline");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "agentq bench --baseline failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    // Both orders ran: the baseline first in the first pair, this build first in the second.
    let firsts: Vec<&str> = stderr.lines().filter(|l| l.contains("A/B pair")).collect();
    assert_eq!(firsts.len(), 4, "{stderr}");
    assert!(
        firsts[0].contains("1/2: other") && firsts[2].contains("2/2: this"),
        "{stderr}"
    );
    let v: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("no output")).expect("JSON");
    assert_eq!(v["pairs"], 2);
    let f = &v["figures"]["ceiling_commits_per_s"];
    assert_eq!(f["this"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(f["other"].as_array().unwrap().len(), 2, "{v}");
    for k in ["ratio_median", "ratio_min", "ratio_max"] {
        let r = f[k].as_f64().unwrap_or_else(|| panic!("{k} in {f}"));
        assert!(r.is_finite() && r > 0.0, "{k} = {r}");
    }
    assert!(stdout.contains("ceiling_commits_per_s"), "{stdout}");
}

#[test]
fn bench_refuses_a_baseline_that_is_not_there() {
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args([
            "bench",
            "--baseline",
            "/nonexistent/agentq",
            "--private",
            "--only",
            "ceiling",
        ])
        .output()
        .expect("running agentq bench");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--baseline /nonexistent/agentq"),
        "{stderr}"
    );
}
