//! The Python and TypeScript clients (`clients/`) against the real server: their own test
//! suites (pytest, `node --test`) run against `agentq dev` and then against a scheduler
//! and a worker on the test kit's Postgres and Redis, the model scripted. Each suite goes
//! through a fault proxy of its own too (`clients/testing/fault_proxy.py`: event streams
//! cut mid-event, 429 and 503 with `Retry-After`, refusals without end).
//!
//! What the suites need is installed once into the test cache: the Python client's pinned
//! requirements in a virtual environment, the TypeScript client's locked npm
//! dependencies. The Python package itself is built and installed (`pip install`) into a
//! temporary directory at every run (once, for both servers), and the TypeScript one
//! compiled with `tsc`, so the tests run the code of this checkout. The TypeScript types are regenerated from
//! `api/openapi.json` and must be the committed `src/schema.ts`
//! (`AGENTQ_UPDATE_OPENAPI=1` rewrites it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use agentq_testkit::RedisServer;
use serde_json::json;

use common::{Dev, Procs, agentq, migrated_db, text, wait_line};

/// The operator key the suites use (it takes every scope).
const KEY: &str = "clients-test-admin-key-0123456789abcdef";

/// The tools the script calls: the default policy allows reads only.
const ALLOWED_TOOLS: &str = "read_file,list_dir,glob,grep,write_file";

fn root() -> PathBuf {
    agentq_testkit::repo_root()
}

/// The suites' webhook receivers listen on loopback, which deliveries may not reach
/// unless the operator allows it.
const WEBHOOK_ENV: [(&str, &str); 1] = [("AGENTQ_WEBHOOKS_ALLOWED_HOSTS", "127.0.0.1")];

/// What the model does (the suites' conftest.py and helpers.mjs name the markers): a
/// plain prompt reads `input.txt`, writes `out/result.txt` and answers `Done: <prompt>` in
/// small chunks (many events for a stream to be cut between); `HOLD-FOR-APPROVAL` writes
/// `approved.txt` (held when the session names `write_file` sensitive); `STREAM-SLOWLY`
/// starts after half a second and streams its answer slowly, so that a reader is there
/// before its first event and while its last ones are written; `FAIL-ONCE`'s
/// first call is refused for good (the session fails) and its retry answers.
fn write_script(dir: &Path) -> PathBuf {
    let script = dir.join("script.json");
    let body = json!({
        "turns": [
            {"text": "Reading.", "tool_calls": [
                {"name": "read_file", "arguments": {"path": "input.txt"}}]},
            {"text": "Writing.", "tool_calls": [
                {"name": "write_file", "arguments":
                    {"path": "out/result.txt", "content": "written by the script"}}]},
            {"text": "Done: {{prompt}}", "chunk_chars": 4},
        ],
        "variants": [
            {"when_prompt_contains": "STREAM-SLOWLY", "turns": [
                {"text": "Reading.", "delay_ms": 500, "tool_calls": [
                    {"name": "read_file", "arguments": {"path": "input.txt"}}]},
                {"text": "Done: {{prompt}}", "chunk_chars": 4, "chunk_delay_ms": 20},
            ]},
            {"when_prompt_contains": "HOLD-FOR-APPROVAL", "turns": [
                {"text": "Asking.", "tool_calls": [{"name": "write_file", "arguments":
                    {"path": "approved.txt", "content": "approved"}}]},
                {"text": "Decided."},
            ]},
            {"when_prompt_contains": "FAIL-ONCE", "turns": [
                {"text": "Recovered.", "fail": [{"status": 400, "message": "scripted refusal"}]},
            ]},
        ],
    });
    std::fs::write(&script, body.to_string()).unwrap();
    script
}

/// A server for the suites: its URL, and what keeps it running.
struct Server {
    url: String,
    _dev: Option<Dev>,
    _procs: Procs,
    _redis: Option<RedisServer>,
}

fn start_dev(dir: &Path) -> Server {
    let script = write_script(dir);
    let dev = Dev::spawn(
        agentq()
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
            .arg(dir.join("dev.db"))
            .arg("--script")
            .arg(&script)
            .arg("--workspace-root")
            .arg(dir.join("ws"))
            .env("AGENTQ_ADMIN_KEY", KEY)
            .env("AGENTQ_POLICY_TOOLS", ALLOWED_TOOLS)
            .envs(WEBHOOK_ENV),
    );
    Server {
        url: dev.url.clone(),
        _dev: Some(dev),
        _procs: Procs(Vec::new()),
        _redis: None,
    }
}

fn start_distributed(dir: &Path) -> Server {
    let script = write_script(dir);
    let db = migrated_db();
    let redis = RedisServer::start().unwrap();
    let mut procs = Procs(Vec::new());
    let mut scheduler = agentq()
        .args(["scheduler", "--addr", "127.0.0.1:0"])
        .env("AGENTQ_DATABASE_URL", &db)
        .env("AGENTQ_REDIS_URL", redis.url())
        .env("AGENTQ_POLICY_TOOLS", ALLOWED_TOOLS)
        .env("AGENTQ_ADMIN_KEY", KEY)
        .envs(WEBHOOK_ENV)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (line, drain) = wait_line(scheduler.stderr.take().unwrap(), "listening on ");
    drop(drain);
    procs.0.push(scheduler);
    let url = line
        .trim()
        .rsplit("listening on ")
        .next()
        .unwrap()
        .to_string();
    let worker = agentq()
        .arg("worker")
        .args(["--database-url", &db])
        .args(["--redis-url", &redis.url()])
        .args(["--default-provider", "scripted"])
        .arg("--script")
        .arg(&script)
        .arg("--workspace-root")
        .arg(dir.join("ws"))
        .env("AGENTQ_POLICY_TOOLS", ALLOWED_TOOLS)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("worker.log")).unwrap())
        .spawn()
        .unwrap();
    procs.0.push(worker);
    Server {
        url,
        _dev: None,
        _procs: procs,
        _redis: Some(redis),
    }
}

/// The Python of the client's test environment (its pinned requirements), made once.
fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            agentq_testkit::python::requirements_python(
                &root().join("clients/python/requirements-test.txt"),
                &[
                    "-c",
                    "import httpx, pydantic, pytest, setuptools, standardwebhooks",
                ],
            )
            .expect("the Python client's test requirements from PyPI, in the test cache")
        })
        .clone()
}

/// The TypeScript client's locked npm dependencies, installed once.
fn node_modules() -> PathBuf {
    static MODULES: OnceLock<PathBuf> = OnceLock::new();
    MODULES
        .get_or_init(|| {
            agentq_testkit::node::node_modules(
                &root().join("clients/typescript"),
                "typescript/bin/tsc",
            )
            .expect("the TypeScript client's npm dependencies, in the test cache")
        })
        .clone()
}

fn run(cmd: &mut Command, what: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("starting {what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

/// Copy `from` into `to` (made), leaving out what a build or a test run left behind.
fn copy_tree(from: &Path, to: &Path) {
    const SKIP: &[&str] = &[
        "node_modules",
        "dist",
        "build",
        "__pycache__",
        ".pytest_cache",
    ];
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        let name_str = name.to_string_lossy();
        if SKIP.contains(&name_str.as_ref()) || name_str.ends_with(".egg-info") {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &to.join(&name));
        } else {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// `pip install` of the Python client from a copy of its source into `dir/site` (for
/// `PYTHONPATH`), its tests beside it in `dir/src/tests`: this checkout's code, packaged
/// as a user would install it.
fn install_python_client(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    copy_tree(&root().join("clients/python"), &src);
    run(
        Command::new(python())
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--no-deps", "--no-build-isolation", "--target"])
            .arg(dir.join("site"))
            .arg(&src),
        "pip install ./clients/python",
    );
    src
}

/// The TypeScript client compiled in a copy of its package (`dir/ts`, its dependencies
/// linked from the cache): the package's directory.
fn build_typescript_client(dir: &Path) -> PathBuf {
    let pkg = dir.join("ts");
    copy_tree(&root().join("clients/typescript"), &pkg);
    std::os::unix::fs::symlink(node_modules(), pkg.join("node_modules")).unwrap();
    run(
        Command::new("node")
            .arg(pkg.join("node_modules/typescript/bin/tsc"))
            .args(["-p", "tsconfig.json"])
            .current_dir(&pkg),
        "tsc",
    );
    pkg
}

/// A fault proxy in front of `url`, stopped when the test ends.
fn fault_proxy(url: &str) -> Dev {
    Dev::spawn(
        Command::new(python())
            .arg(root().join("clients/testing/fault_proxy.py"))
            .arg(url),
    )
}

fn suite_env(cmd: &mut Command, url: &str, proxy: &Dev) {
    common::clean(cmd);
    cmd.env("AGENTQ_URL", url)
        .env("AGENTQ_API_KEY", KEY)
        .env("AGENTQ_FAULT_URL", &proxy.url)
        .env("AGENTQ_OPENAPI", root().join("api/openapi.json"));
}

/// Both clients built from this checkout, once per test binary: the suites only read
/// them (no bytecode, no pytest cache, `tsc`'s output already written), so the two
/// servers' runs share one `pip install` and one `tsc`.
struct Built {
    _dir: tempfile::TempDir,
    /// The Python client's installed package (for `PYTHONPATH`).
    site: PathBuf,
    /// The Python client's source, its tests in `tests`.
    py_src: PathBuf,
    /// The TypeScript client's compiled package.
    ts: PathBuf,
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let (py, ts) = (dir.path().join("py"), dir.path().join("node"));
        let (py_src, ts) = std::thread::scope(|s| {
            let py_src = s.spawn(|| install_python_client(&py));
            let ts = s.spawn(|| build_typescript_client(&ts));
            (py_src.join().unwrap(), ts.join().unwrap())
        });
        Built {
            site: py.join("site"),
            py_src,
            ts,
            _dir: dir,
        }
    })
}

fn pytest(url: &str) -> Output {
    let built = built();
    let proxy = fault_proxy(url);
    let mut cmd = Command::new(python());
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
        .current_dir(&built.py_src)
        .env("PYTHONPATH", &built.site)
        .env("PYTHONDONTWRITEBYTECODE", "1");
    suite_env(&mut cmd, url, &proxy);
    cmd.output().unwrap()
}

fn node_test(url: &str) -> Output {
    let pkg = &built().ts;
    let proxy = fault_proxy(url);
    let mut files: Vec<_> = std::fs::read_dir(pkg.join("test"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".test.mjs"))
        .map(|n| format!("test/{n}"))
        .collect();
    files.sort();
    let mut cmd = Command::new("node");
    // One file at a time: the fault proxy's counts are per suite.
    cmd.args(["--test", "--test-concurrency=1"])
        .args(&files)
        .current_dir(pkg);
    suite_env(&mut cmd, url, &proxy);
    cmd.output().unwrap()
}

/// Both suites against `url` side by side (each with its own proxy); panics with their
/// reports unless both passed and ran tests against the server.
fn run_suites(dir: &Path, url: &str) {
    // Installed and built before the suites start, once per test binary (both tests use
    // them).
    python();
    node_modules();
    built();
    let (py, ts) = std::thread::scope(|s| {
        let py = s.spawn(|| pytest(url));
        let ts = s.spawn(|| node_test(url));
        (py.join().unwrap(), ts.join().unwrap())
    });
    // A worker's log (the distributed stack's) goes with a failure's report.
    let log = std::fs::read_to_string(dir.join("worker.log")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(60).collect();
    let tail: String = tail.into_iter().rev().collect::<Vec<_>>().join("\n");
    let py_report = format!("{}{}\n{tail}", text(&py.stdout), text(&py.stderr));
    let ts_report = format!("{}{}\n{tail}", text(&ts.stdout), text(&ts.stderr));
    assert!(
        py.status.success(),
        "pytest failed against {url}:\n{py_report}"
    );
    assert!(
        ts.status.success(),
        "node --test failed against {url}:\n{ts_report}"
    );
    // The server tests ran: a suite that skipped them all would pass too.
    let passed = py_report
        .lines()
        .find_map(|l| l.trim().split_once(" passed").map(|(n, _)| n.to_string()))
        .and_then(|n| n.rsplit(' ').next().and_then(|n| n.parse::<u32>().ok()));
    assert!(
        passed.is_some_and(|n| n >= 30),
        "pytest ran too few tests:\n{py_report}"
    );
    // A test skips itself only when the served document lacks its route: every route the
    // client has is on this server.
    assert!(
        !py_report
            .lines()
            .any(|l| l.contains(" passed") && l.contains(" skipped")),
        "pytest skipped tests:\n{py_report}"
    );
    let ts_pass = ts_report
        .lines()
        .find_map(|l| l.strip_prefix("# pass ")?.trim().parse::<u32>().ok());
    let ts_skipped = ts_report
        .lines()
        .find_map(|l| l.strip_prefix("# skipped ")?.trim().parse::<u32>().ok());
    assert!(
        ts_pass.is_some_and(|n| n >= 12) && ts_skipped == Some(0),
        "node --test ran too few tests:\n{ts_report}"
    );
}

#[test]
fn clients_against_agentq_dev() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_dev(dir.path());
    run_suites(dir.path(), &server.url);
}

#[test]
fn clients_against_the_distributed_stack() {
    let dir = tempfile::tempdir().unwrap();
    let server = start_distributed(dir.path());
    run_suites(dir.path(), &server.url);
}

/// The committed `src/schema.ts` is what openapi-typescript makes of `api/openapi.json`.
#[test]
fn typescript_types_are_generated_from_the_document() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("schema.ts");
    run(
        Command::new("node")
            .arg(node_modules().join("openapi-typescript/bin/cli.js"))
            .arg(root().join("api/openapi.json"))
            .arg("-o")
            .arg(&out),
        "openapi-typescript",
    );
    let generated = std::fs::read_to_string(&out).unwrap();
    let committed_path = root().join("clients/typescript/src/schema.ts");
    if std::env::var_os("AGENTQ_UPDATE_OPENAPI").is_some() {
        std::fs::write(&committed_path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap();
    assert!(
        generated == committed,
        "clients/typescript/src/schema.ts is not generated from api/openapi.json: run \
         AGENTQ_UPDATE_OPENAPI=1 cargo test -p agentq-cli --test it clients::typescript_types"
    );
}
