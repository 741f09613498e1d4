//! `agentq bench --baseline OTHER`: this build against another one, measured alternately in
//! one sitting, so that each figure comes out as a ratio (this / other) with its spread
//! across pairs instead of two runs minutes apart on a machine whose speed drifts.
//!
//! Each run is a child process (`<binary> bench … --json`) with the same arguments, on the
//! same Postgres and Redis servers (private ones started once here with `--private`), each
//! against a database of its own created for it and dropped after it, so that neither
//! build inherits the other's tables, bloat or free space. The order alternates within
//! pairs (other first in even pairs, this first in odd ones), so that a trend over the
//! sitting (a warming cache, a neighbour's load) weighs on both builds alike.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};

use agentq_core::pg::PgStore;

use crate::args::BenchArgs;
use crate::env::services;
use crate::report::progress;
use crate::storage::with_database;

/// The flags this mode owns or sets for each child itself: they are not passed on.
/// (name, whether it takes a value)
const OWN_FLAGS: &[(&str, bool)] = &[
    ("--baseline", true),
    ("--pairs", true),
    ("--private", false),
    ("--database-url", true),
    ("--redis-url", true),
    ("--json", false),
];

/// One figure across the sitting: each build's values in run order, and the ratios of
/// the pairs where both had it.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Figure {
    pub this: Vec<f64>,
    pub other: Vec<f64>,
    pub ratios: Vec<f64>,
}

impl Figure {
    fn ratio_median(&self) -> Option<f64> {
        median(&self.ratios)
    }
}

/// Run the A/B sitting that `args.baseline` asks for. `argv` is this process's arguments
/// after `bench`: what each child gets, less the flags of [`OWN_FLAGS`].
pub async fn compare(args: &BenchArgs, argv: &[OsString]) -> anyhow::Result<ExitCode> {
    let Some(baseline) = args.baseline.clone() else {
        bail!("--baseline is required for an A/B sitting");
    };
    let baseline =
        resolve(&baseline).with_context(|| format!("--baseline {}", baseline.display()))?;
    let this = match &args.agentq_binary {
        Some(p) => p.clone(),
        None => std::env::current_exe().context("finding this agentq binary")?,
    };
    let forwarded = forwarded(argv);
    let (db_url, redis_url, _private) = services(args)?;
    let admin = PgStore::connect(&db_url, 2)
        .await
        .context("cannot connect to Postgres")?;
    let sitting = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();

    let mut figures: BTreeMap<String, Figure> = BTreeMap::new();
    for pair in 0..args.pairs {
        let order: [(&str, &Path); 2] = if pair.is_multiple_of(2) {
            [("other", &baseline), ("this", &this)]
        } else {
            [("this", &this), ("other", &baseline)]
        };
        let mut results: [Option<Map<String, Value>>; 2] = [None, None];
        for (build, binary) in order {
            progress(&format!(
                "A/B pair {}/{}: {build} ({})",
                pair + 1,
                args.pairs,
                binary.display()
            ));
            let db = format!("agentq_ab_{sitting}_{pair}_{build}");
            sqlx::query(&format!("CREATE DATABASE {db}"))
                .execute(admin.pool())
                .await
                .with_context(|| format!("creating the run's database {db}"))?;
            let url = with_database(&db_url, &db).context("the Postgres URL has no host part")?;
            let out = child(binary, &forwarded, &url, &redis_url).await;
            let _ = sqlx::query(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
                .execute(admin.pool())
                .await;
            let slot = usize::from(build == "other");
            results[slot] = Some(out.with_context(|| format!("the {build} build's run"))?);
        }
        let [Some(this_r), Some(other_r)] = results else {
            bail!("a run of pair {} gave no result", pair + 1);
        };
        add_pair(&mut figures, &this_r, &other_r);
    }

    print!("{}", table(&figures, &baseline, args.pairs));
    if args.json {
        println!("{}", to_json(&figures, &baseline, args.pairs));
    }
    Ok(ExitCode::SUCCESS)
}

/// `path` as given when it names a file, else found on `PATH` (`agentq-7253b35`).
fn resolve(path: &Path) -> anyhow::Result<PathBuf> {
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    if path.components().count() == 1 {
        let paths = std::env::var_os("PATH").unwrap_or_default();
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join(path);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!("no such file")
}

/// `argv` without the flags this mode sets itself (either `--flag value` or `--flag=value`).
fn forwarded(argv: &[OsString]) -> Vec<OsString> {
    let mut out = Vec::with_capacity(argv.len());
    let mut skip_value = false;
    for a in argv {
        if skip_value {
            skip_value = false;
            continue;
        }
        let text = a.to_string_lossy();
        let own = OWN_FLAGS.iter().find(|(name, _)| {
            text == *name || text.strip_prefix(name).is_some_and(|r| r.starts_with('='))
        });
        match own {
            Some((name, takes_value)) => skip_value = *takes_value && text == *name,
            None => out.push(a.clone()),
        }
    }
    out
}

/// One child run: its figures, the JSON object on the last line of its output.
async fn child(
    binary: &Path,
    args: &[OsString],
    db_url: &str,
    redis_url: &str,
) -> anyhow::Result<Map<String, Value>> {
    let out = tokio::process::Command::new(binary)
        .arg("bench")
        .args(args)
        .args(["--database-url", db_url, "--redis-url", redis_url, "--json"])
        .env_remove("AGENTQ_DATABASE_URL")
        .env_remove("AGENTQ_REDIS_URL")
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("running {}", binary.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "{} bench exited with {}:\n{stdout}",
            binary.display(),
            out.status
        );
    }
    let last = stdout.lines().last().unwrap_or_default();
    match serde_json::from_str(last) {
        Ok(Value::Object(m)) => Ok(m),
        _ => bail!("its output does not end in a JSON object:\n{stdout}"),
    }
}

/// Every number in `v`, nested objects flattened with `.` (`bytes_per_iteration.10`).
fn numbers(prefix: &str, v: &Map<String, Value>, out: &mut BTreeMap<String, f64>) {
    for (k, v) in v {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            Value::Number(n) => {
                if let Some(x) = n.as_f64().filter(|x| x.is_finite()) {
                    out.insert(key, x);
                }
            }
            Value::Object(m) => numbers(&key, m, out),
            _ => {}
        }
    }
}

/// Record one pair's figures. A ratio is taken only where both builds have the figure and
/// the baseline's is not zero; a figure one build lacks is still listed with its values.
pub(crate) fn add_pair(
    figures: &mut BTreeMap<String, Figure>,
    this: &Map<String, Value>,
    other: &Map<String, Value>,
) {
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    numbers("", this, &mut a);
    numbers("", other, &mut b);
    for (k, x) in &a {
        let f = figures.entry(k.clone()).or_default();
        f.this.push(*x);
        if let Some(y) = b.get(k).filter(|y| **y != 0.0) {
            f.ratios.push(x / y);
        }
    }
    for (k, y) in b {
        figures.entry(k).or_default().other.push(y);
    }
}

fn median(xs: &[f64]) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    Some(if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    })
}

fn min_max(xs: &[f64]) -> Option<(f64, f64)> {
    let min = xs.iter().copied().min_by(f64::total_cmp)?;
    let max = xs.iter().copied().max_by(f64::total_cmp)?;
    Some((min, max))
}

fn fmt(x: Option<f64>) -> String {
    match x {
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.4}"),
        None => "-".into(),
    }
}

pub(crate) fn table(figures: &BTreeMap<String, Figure>, baseline: &Path, pairs: u32) -> String {
    let mut s = format!(
        "A/B: this build / {} over {pairs} alternating pairs (medians; ratio spread min-max)\n",
        baseline.display()
    );
    s.push_str(&format!(
        "{:<44} {:>12} {:>12} {:>8} {:>17}\n",
        "figure", "other", "this", "ratio", "spread"
    ));
    for (k, f) in figures {
        let spread = min_max(&f.ratios)
            .map(|(lo, hi)| format!("{lo:.3}-{hi:.3}"))
            .unwrap_or_else(|| "-".into());
        let ratio = f
            .ratio_median()
            .map_or_else(|| "-".into(), |r| format!("{r:.3}"));
        s.push_str(&format!(
            "{k:<44} {:>12} {:>12} {ratio:>8} {spread:>17}\n",
            fmt(median(&f.other)),
            fmt(median(&f.this)),
        ));
    }
    s
}

pub(crate) fn to_json(figures: &BTreeMap<String, Figure>, baseline: &Path, pairs: u32) -> Value {
    let mut out = Map::new();
    for (k, f) in figures {
        let (lo, hi) = min_max(&f.ratios).unzip();
        out.insert(
            k.clone(),
            json!({
                "this": f.this,
                "other": f.other,
                "ratio_median": f.ratio_median(),
                "ratio_min": lo,
                "ratio_max": hi,
            }),
        );
    }
    json!({
        "baseline": baseline.display().to_string(),
        "pairs": pairs,
        "figures": out,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_children_get_every_flag_but_the_sittings_own() {
        let argv = os(&[
            "--baseline",
            "/opt/agentq-old",
            "--only",
            "ceiling,throughput",
            "--pairs=6",
            "--private",
            "--database-url=postgres://x",
            "--redis-url",
            "redis://y",
            "--sessions",
            "200",
            "--json",
        ]);
        assert_eq!(
            forwarded(&argv),
            os(&["--only", "ceiling,throughput", "--sessions", "200"])
        );
        // A flag that merely starts like one of them is passed on.
        assert_eq!(forwarded(&os(&["--pairsx", "1"])), os(&["--pairsx", "1"]));
    }

    #[test]
    fn ratios_are_this_over_other_per_pair_with_their_spread() {
        let mut figures = BTreeMap::new();
        let run = |ips: f64, cpu: f64, b10: f64| {
            json!({"iterations_per_s": ips, "worker_cpu_ms_per_iteration": cpu,
                   "tool": "trivial", "recovery_s": null,
                   "bytes_per_iteration": {"10": b10}})
            .as_object()
            .unwrap()
            .clone()
        };
        add_pair(
            &mut figures,
            &run(110.0, 0.09, 900.0),
            &run(100.0, 0.1, 900.0),
        );
        add_pair(&mut figures, &run(90.0, 0.1, 950.0), &run(100.0, 0.1, 0.0));
        let ips = &figures["iterations_per_s"];
        assert_eq!(ips.this, vec![110.0, 90.0]);
        assert_eq!(ips.other, vec![100.0, 100.0]);
        assert!((ips.ratio_median().unwrap() - 1.0).abs() < 1e-9);
        assert_eq!(min_max(&ips.ratios), Some((0.9, 1.1)));
        // Nested figures are flattened; a zero baseline gives no ratio.
        assert_eq!(figures["bytes_per_iteration.10"].ratios, vec![1.0]);
        // Strings and nulls are not figures.
        assert!(!figures.contains_key("tool") && !figures.contains_key("recovery_s"));
        let j = to_json(&figures, Path::new("old"), 2);
        assert_eq!(j["figures"]["iterations_per_s"]["ratio_min"], 0.9);
        assert!(table(&figures, Path::new("old"), 2).contains("iterations_per_s"));
    }
}
