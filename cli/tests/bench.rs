#![allow(clippy::unwrap_used, clippy::expect_used)]
//! `agentq bench` end to end, small: it starts its own Redis and durable Postgres
//! (`--private`), runs five parts and prints one JSON object on its last line. Performance
//! is measured, never asserted: only that every figure is there and makes sense.

use std::process::Command;

#[test]
fn bench_prints_every_figure_as_json() {
    let out = Command::new(env!("CARGO_BIN_EXE_agentq"))
        .args([
            "bench",
            "--private",
            "--sessions",
            "20",
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
        "recovery_s",
    ] {
        assert!(v.get(key).is_some_and(|x| x.is_null()), "{key} in {v}");
    }
    assert_eq!(v["throughput_failed_sessions"], 0, "{v}");
    // The human table comes first.
    assert!(stdout.contains("ceiling"), "{stdout}");
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
        stderr.contains("trivial") && stderr.contains("list_dir"),
        "{stderr}"
    );
}
