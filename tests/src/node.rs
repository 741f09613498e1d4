//! Node packages from the npm registry for tests, installed with `npm ci` into the test
//! cache ([`crate::python::cache_dir`]) from a committed `package-lock.json`, never
//! system-wide: the TypeScript client's compiler and type generator ([`node_modules`]).
//! A fresh machine needs `node` and `npm` (`scripts/test` installs them) and access to
//! the registry once.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::python::{cache_dir, fnv1a};

/// The `node_modules` holding the locked dependencies (dev ones included) of the package
/// in `package_dir` (its `package.json` and `package-lock.json`), installed on first use
/// under a name hashed from both files: a changed lock installs afresh. `probe` (a path
/// inside `node_modules`) tells a complete install from a half-made one.
pub fn node_modules(package_dir: &Path, probe: &str) -> Result<PathBuf> {
    let read = |f: &str| {
        std::fs::read(package_dir.join(f))
            .with_context(|| format!("reading {}", package_dir.join(f).display()))
    };
    let mut both = read("package.json")?;
    both.extend(read("package-lock.json")?);
    let cache = cache_dir();
    let dir = cache.join(format!("npm-{:016x}", fnv1a(&both)));
    let modules = dir.join("node_modules");
    if modules.join(probe).exists() {
        return Ok(modules);
    }
    std::fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    // Made beside it and renamed into place, as the Python environments are.
    let tmp = cache.join(format!(".npm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    for f in ["package.json", "package-lock.json"] {
        std::fs::copy(package_dir.join(f), tmp.join(f))?;
    }
    let out = Command::new("npm")
        .args([
            "ci",
            "--no-audit",
            "--no-fund",
            "--ignore-scripts",
            "--loglevel=error",
        ])
        .current_dir(&tmp)
        .output()
        .context("starting npm (install nodejs and npm; scripts/test does)")?;
    if !out.status.success() {
        bail!(
            "npm ci in {} failed ({}):\n{}{}",
            tmp.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    if !modules.join(probe).exists() {
        bail!("{} has no {probe} after npm ci", modules.display());
    }
    Ok(modules)
}
