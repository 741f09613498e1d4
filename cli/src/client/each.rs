//! `agentq submit --each GLOB PROMPT`: the files a glob matches (sorted), one session
//! each, with that file as the session's input beside any `--input` given to all.
//!
//! The glob is matched here, not by the shell (quote it), so that thousands of files do
//! not overflow the command line: `*` and `?` stay within a path component, `**` crosses
//! them, `[a-z]` and `{a,b}` work as in a shell. The walk starts at the pattern's literal
//! leading directories, never follows symbolic links, and does not enter hidden
//! directories.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use globset::{GlobBuilder, GlobMatcher};
use serde_json::{Map, Value};

use crate::inputs::collect_inputs;

/// Files one `--each` may match at most (a batch this size takes several requests).
const MAX_FILES: usize = 100_000;

/// The placeholder a prompt may hold for the input file's path in the workspace.
pub(super) const FILE_PLACEHOLDER: &str = "{file}";

fn is_meta(c: char) -> bool {
    matches!(c, '*' | '?' | '[' | ']' | '{' | '}')
}

/// The regular files `pattern` matches, sorted by path.
pub(super) fn expand(pattern: &str) -> anyhow::Result<Vec<PathBuf>> {
    let matcher: GlobMatcher = GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| anyhow!("--each {pattern:?}: not a valid glob: {e}"))?
        .compile_matcher();
    // The literal leading directories: where the walk starts.
    let parts: Vec<&str> = pattern.split('/').collect();
    let literal = parts
        .iter()
        .take(parts.len().saturating_sub(1))
        .take_while(|p| !p.chars().any(is_meta))
        .count();
    let base = parts[..literal].join("/");
    let deep = pattern.contains("**");
    // Components below the base a match can have (unbounded with `**`).
    let depth = parts.len().saturating_sub(literal);
    let start = if base.is_empty() && pattern.starts_with('/') {
        PathBuf::from("/")
    } else if base.is_empty() {
        PathBuf::from(".")
    } else {
        PathBuf::from(&base)
    };
    let mut found = Vec::new();
    if start.is_dir() {
        let prefix = if base.is_empty() && !pattern.starts_with('/') {
            String::new()
        } else {
            format!("{}/", base.trim_end_matches('/'))
        };
        walk(&start, &prefix, 1, deep, depth, &matcher, &mut found)
            .with_context(|| format!("--each {pattern:?}"))?;
    } else if !pattern.chars().any(is_meta) && Path::new(pattern).is_file() {
        found.push(PathBuf::from(pattern));
    }
    if found.is_empty() {
        bail!("--each {pattern:?}: no file matches");
    }
    found.sort();
    Ok(found)
}

fn walk(
    dir: &Path,
    prefix: &str,
    level: usize,
    deep: bool,
    depth: usize,
    matcher: &GlobMatcher,
    found: &mut Vec<PathBuf>,
) -> anyhow::Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for e in entries {
        let e = e.with_context(|| format!("cannot list {}", dir.display()))?;
        let Some(name) = e.file_name().to_str().map(str::to_string) else {
            continue;
        };
        let rel = format!("{prefix}{name}");
        let kind = e
            .file_type()
            .with_context(|| format!("cannot inspect {rel}"))?;
        if kind.is_symlink() {
            continue;
        }
        if kind.is_dir() {
            if (deep || level < depth) && !name.starts_with('.') {
                walk(
                    &e.path(),
                    &format!("{rel}/"),
                    level.saturating_add(1),
                    deep,
                    depth,
                    matcher,
                    found,
                )?;
            }
        } else if kind.is_file() && matcher.is_match(&rel) {
            if found.len() >= MAX_FILES {
                bail!("matches more than {MAX_FILES} files");
            }
            found.push(PathBuf::from(rel));
        }
    }
    Ok(())
}

/// One session request per file: `defaults` (the flags), the shared `--input` files,
/// the file itself, the prompt (its [`FILE_PLACEHOLDER`] replaced by the file's path in
/// the workspace, or a line naming it appended), and `metadata.file` naming it.
pub(super) fn requests(
    files: &[PathBuf],
    prompt: &str,
    defaults: &Map<String, Value>,
    shared: &Map<String, Value>,
) -> anyhow::Result<Vec<(String, Value)>> {
    let mut out = Vec::with_capacity(files.len());
    for f in files {
        let shown = f.display().to_string();
        let own = collect_inputs(std::slice::from_ref(f), &[])
            .map_err(|e| anyhow!("--each: {}", e.to_string().trim_start_matches("--input ")))?;
        let mut all = shared.clone();
        let mut place = String::new();
        for (path, content) in own {
            if all.contains_key(&path) {
                bail!("--each {shown}: {path:?} is also given by --input");
            }
            place.clone_from(&path);
            all.insert(path, content);
        }
        let mut body = defaults.clone();
        let text = if prompt.contains(FILE_PLACEHOLDER) {
            prompt.replace(FILE_PLACEHOLDER, &place)
        } else {
            format!("{prompt}\n\nThe input file is `{place}` in your workspace.")
        };
        body.insert("prompt".into(), Value::String(text));
        body.insert("files".into(), Value::Object(all));
        let mut meta = match body.remove("metadata") {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        meta.insert("file".into(), Value::String(shown.clone()));
        body.insert("metadata".into(), Value::Object(meta));
        out.push((shown, Value::Object(body)));
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn globs_match_sorted_files_and_say_when_none_does() {
        let root = tempfile::tempdir().unwrap();
        let d = root.path();
        std::fs::create_dir_all(d.join("tickets/old")).unwrap();
        for f in [
            "tickets/b.txt",
            "tickets/a.txt",
            "tickets/c.md",
            "tickets/old/z.txt",
        ] {
            std::fs::write(d.join(f), "x").unwrap();
        }
        std::os::unix::fs::symlink(d.join("tickets/a.txt"), d.join("tickets/l.txt")).unwrap();
        let base = d.display().to_string();
        let names = |p: &str| -> Vec<String> {
            expand(&format!("{base}/{p}"))
                .unwrap()
                .iter()
                .map(|f| f.display().to_string().replace(&format!("{base}/"), ""))
                .collect()
        };
        assert_eq!(names("tickets/*.txt"), ["tickets/a.txt", "tickets/b.txt"]);
        assert_eq!(
            names("tickets/**/*.txt"),
            ["tickets/a.txt", "tickets/b.txt", "tickets/old/z.txt"]
        );
        assert_eq!(names("*/old/*"), ["tickets/old/z.txt"]);
        assert_eq!(names("tickets/{a,c}.*"), ["tickets/a.txt", "tickets/c.md"]);
        assert_eq!(names("tickets/a.txt"), ["tickets/a.txt"]);
        let e = expand(&format!("{base}/tickets/*.pdf")).unwrap_err();
        assert!(
            e.to_string().starts_with("--each ") && e.to_string().ends_with("no file matches"),
            "{e}"
        );
        let e = expand(&format!("{base}/nowhere/*.txt")).unwrap_err();
        assert!(e.to_string().ends_with("no file matches"), "{e}");
        assert!(expand("[").unwrap_err().to_string().starts_with("--each"));
    }

    #[test]
    fn each_file_is_one_request() {
        let root = tempfile::tempdir().unwrap();
        let a = root.path().join("a.txt");
        std::fs::write(&a, "ticket A").unwrap();
        let mut defaults = Map::new();
        defaults.insert("metadata".into(), json!({"team": "x"}));
        defaults.insert("queue".into(), json!("bulk"));
        let mut shared = Map::new();
        shared.insert("guide.md".into(), json!("how to"));
        let reqs = requests(
            std::slice::from_ref(&a),
            "Summarise {file}",
            &defaults,
            &shared,
        )
        .unwrap();
        let (shown, body) = &reqs[0];
        assert_eq!(shown, &a.display().to_string());
        assert_eq!(body["prompt"], "Summarise a.txt");
        assert_eq!(body["queue"], "bulk");
        assert_eq!(
            body["files"],
            json!({"a.txt": "ticket A", "guide.md": "how to"})
        );
        assert_eq!(
            body["metadata"],
            json!({"team": "x", "file": a.display().to_string()})
        );
        let reqs = requests(&[a], "Summarise the ticket", &Map::new(), &Map::new()).unwrap();
        assert_eq!(
            reqs[0].1["prompt"],
            "Summarise the ticket\n\nThe input file is `a.txt` in your workspace."
        );
    }
}
