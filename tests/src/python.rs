//! Pythons with pinned packages from PyPI, each in a virtual environment under the test
//! cache ([`cache_dir`]), made on first use: the official MCP SDK (`mcp`), for tests that
//! drive `/mcp` with the client other agents use ([`mcp_python`]), schemathesis, which
//! fuzzes the API against its OpenAPI document ([`schemathesis`]), the Standard Webhooks
//! library the webhook tests' receiver verifies signatures with ([`webhooks_python`]), and
//! the pinned requirements of a file ([`requirements_python`], the Python client's test
//! suite). A fresh machine needs only `python3` with its `venv` module (`scripts/test`
//! installs it) and access to PyPI once.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};

/// The SDK the tests' clients run, pinned: a new release must not change a test's outcome.
pub const MCP_PACKAGE: &str = "mcp==2.3.0";

/// The API fuzzer, pinned for the same reason (its checks and its generation change
/// between releases).
pub const SCHEMATHESIS_PACKAGE: &str = "schemathesis==4.32.5";

/// The Standard Webhooks reference library, pinned: the webhook tests' receiver verifies
/// every delivery with it.
pub const STANDARD_WEBHOOKS_PACKAGE: &str = "standardwebhooks==1.3.0";

/// Where tests keep what they install once for every run: `$AGENTQ_TEST_CACHE`, else
/// `$XDG_CACHE_HOME/agentq-tests`, else `~/.cache/agentq-tests`, else the workspace's
/// `target/agentq-tests`.
pub fn cache_dir() -> PathBuf {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = env("AGENTQ_TEST_CACHE") {
        return d;
    }
    if let Some(d) = env("XDG_CACHE_HOME") {
        return d.join("agentq-tests");
    }
    if let Some(h) = env("HOME") {
        return h.join(".cache/agentq-tests");
    }
    crate::repo_root().join("target/agentq-tests")
}

/// The `python` of a virtual environment holding [`MCP_PACKAGE`], made if missing. The
/// base interpreter is `$AGENTQ_PYTHON`, else `python3`.
pub fn mcp_python() -> Result<PathBuf> {
    static PYTHON: Made = OnceLock::new();
    pinned(
        &PYTHON,
        MCP_PACKAGE,
        &["-c", "import mcp.client.streamable_http"],
    )
}

/// The `python` of a virtual environment holding [`STANDARD_WEBHOOKS_PACKAGE`], made if
/// missing.
pub fn webhooks_python() -> Result<PathBuf> {
    static PYTHON: Made = OnceLock::new();
    pinned(
        &PYTHON,
        STANDARD_WEBHOOKS_PACKAGE,
        &["-c", "from standardwebhooks import Webhook"],
    )
}

/// Schemathesis's command line (`st`), from a virtual environment holding
/// [`SCHEMATHESIS_PACKAGE`], made if missing. Run through its `python`: the environment
/// was made under another name and renamed, which its scripts' `#!` lines do not follow.
pub fn schemathesis() -> Result<Command> {
    const CLI: [&str; 2] = ["-m", "schemathesis.cli"];
    static PYTHON: Made = OnceLock::new();
    let python = pinned(
        &PYTHON,
        SCHEMATHESIS_PACKAGE,
        &[CLI[0], CLI[1], "--version"],
    )?;
    let mut st = Command::new(python);
    st.args(CLI);
    Ok(st)
}

/// A virtual environment made at most once per test binary (its outcome kept, a failure
/// included, so every test reports the same one).
type Made = OnceLock<std::result::Result<PathBuf, String>>;

/// The `python` of the environment `venv-<name>-<version>` holding the pinned `package`
/// (`name==version`), made through `made` once per test binary.
fn pinned(made: &Made, package: &str, probe: &[&str]) -> Result<PathBuf> {
    made.get_or_init(|| {
        venv_with(&package.replace("==", "-"), &[package], probe).map_err(|e| format!("{e:#}"))
    })
    .clone()
    .map_err(|e| anyhow::anyhow!(e))
}

/// The `python` of a virtual environment holding every package of the requirements
/// file `requirements` (pinned, `name==version` a line), made if missing. The environment
/// is named by a hash of the file: a changed pin makes a new one.
pub fn requirements_python(requirements: &Path, probe: &[&str]) -> Result<PathBuf> {
    let text = std::fs::read(requirements)
        .with_context(|| format!("reading {}", requirements.display()))?;
    let name = format!("req-{:016x}", fnv1a(&text));
    let file = requirements.to_string_lossy().into_owned();
    venv_with(&name, &["-r", &file], probe)
}

/// A stable hash of `bytes` (FNV-1a, 64 bits): a cache key that stays the same across
/// builds and toolchains, unlike `std`'s hasher.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Whether `python` runs `probe` (its arguments) successfully.
fn works(python: &Path, probe: &[&str]) -> bool {
    Command::new(python)
        .args(probe)
        .output()
        .is_ok_and(|o| o.status.success())
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// The `python` of the virtual environment `venv-<name>`, made if missing by `pip install`
/// with `install` (its arguments); `probe` (arguments to the python) tells a working one
/// from a half-made one.
fn venv_with(name: &str, install: &[&str], probe: &[&str]) -> Result<PathBuf> {
    let cache = cache_dir();
    let what = install.join(" ");
    let venv = cache.join(format!("venv-{name}"));
    let python = venv.join("bin/python");
    if works(&python, probe) {
        return Ok(python);
    }
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    // Made beside it and renamed into place: two test binaries at once never use a
    // half-made environment, and the loser of the race uses the winner's.
    let tmp = cache.join(format!(".venv-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let base = std::env::var_os("AGENTQ_PYTHON").unwrap_or_else(|| "python3".into());
    run(
        Command::new(&base).arg("-m").arg("venv").arg(&tmp),
        "python3 -m venv (install python3-venv; scripts/test does)",
    )?;
    run(
        Command::new(tmp.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(install),
        &format!("pip install {what}"),
    )?;
    if std::fs::rename(&tmp, &venv).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    if !works(&python, probe) {
        bail!(
            "{} cannot run {probe:?} after installing {what}",
            python.display()
        );
    }
    Ok(python)
}
