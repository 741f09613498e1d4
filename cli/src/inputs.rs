//! The local files `agentq submit --input PATH… --input-dir DIR…` sends: read into the
//! request's `files` map, each path held to the API's rules and the totals to its hard
//! bounds before more is read.

use std::path::{Component, Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use base64::Engine as _;
use serde_json::{Map, Value, json};

use agentq_core::workspace_path::{
    FileLimits, MAX_INPUT_BYTES, MAX_INPUT_FILES, MAX_PATH_BYTES, MAX_PATH_DEPTH, Tree, normalize,
};

/// The widest paths any server accepts: it judges a request's paths by its own policy.
pub(crate) const ANY_PATH: FileLimits = FileLimits {
    max_path_bytes: MAX_PATH_BYTES,
    max_path_depth: MAX_PATH_DEPTH,
    ..FileLimits::DEFAULT
};

/// The `files` of a request from `--input` files and `--input-dir` directories: text as
/// a string, anything else (not UTF-8, or holding NUL) as base64. Errors name the flag
/// and the path. The totals are held to the API's hard bounds here, before more is read;
/// the server judges the rest by its policy.
pub fn collect_inputs(inputs: &[PathBuf], dirs: &[PathBuf]) -> anyhow::Result<Map<String, Value>> {
    let mut c = Collector::default();
    for p in inputs {
        let shown = p.display();
        let meta =
            std::fs::metadata(p).with_context(|| format!("--input {shown}: cannot read it"))?;
        if !meta.is_file() {
            bail!("--input {shown}: not a regular file (use --input-dir for a directory)");
        }
        let rel =
            input_place(p).ok_or_else(|| anyhow!("--input {shown}: the name is not UTF-8"))?;
        c.add("--input", &shown.to_string(), &rel, p)?;
    }
    for d in dirs {
        let shown = d.display().to_string();
        let meta =
            std::fs::metadata(d).with_context(|| format!("--input-dir {shown}: cannot read it"))?;
        if !meta.is_dir() {
            bail!("--input-dir {shown}: not a directory");
        }
        let mut skipped = 0usize;
        walk(
            d,
            "",
            &mut |rel, full| c.add("--input-dir", &shown, rel, full),
            &mut skipped,
        )
        .with_context(|| format!("--input-dir {shown}"))?;
        if skipped > 0 {
            eprintln!(
                "agentq: --input-dir {shown}: skipped {skipped} symbolic links, special files and .git directories"
            );
        }
    }
    Ok(c.files)
}

/// Where `--input PATH` lands: a relative path without `..` as it is, else its name.
fn input_place(p: &Path) -> Option<String> {
    let keeps = p.is_relative()
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if keeps {
        let parts: Option<Vec<&str>> = p
            .components()
            .filter_map(|c| match c {
                Component::Normal(s) => Some(s.to_str()),
                _ => None,
            })
            .collect();
        return parts.map(|v| v.join("/"));
    }
    p.file_name()?.to_str().map(str::to_string)
}

/// Every regular file under `dir` (relative paths joined with `/`), in name order;
/// symbolic links (never followed), special files and `.git` directories are counted in
/// `skipped`.
fn walk(
    dir: &Path,
    prefix: &str,
    add: &mut dyn FnMut(&str, &Path) -> anyhow::Result<()>,
    skipped: &mut usize,
) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("cannot list {}", dir.display()))?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        let full = e.path();
        let name = e.file_name();
        let name = name
            .to_str()
            .ok_or_else(|| anyhow!("{}: the name is not UTF-8", full.display()))?;
        let rel = if prefix.is_empty() {
            name.to_string()
        } else {
            format!("{prefix}/{name}")
        };
        let kind = e
            .file_type()
            .with_context(|| format!("cannot inspect {}", full.display()))?;
        if kind.is_symlink() {
            *skipped = skipped.saturating_add(1);
        } else if kind.is_dir() {
            if name
                .trim_end_matches(['.', ' '])
                .eq_ignore_ascii_case(".git")
            {
                *skipped = skipped.saturating_add(1);
                continue;
            }
            walk(&full, &rel, add, skipped)?;
        } else if kind.is_file() {
            add(&rel, &full)?;
        } else {
            *skipped = skipped.saturating_add(1);
        }
    }
    Ok(())
}

#[derive(Default)]
struct Collector {
    files: Map<String, Value>,
    tree: Tree,
    bytes: u64,
}

impl Collector {
    fn add(&mut self, flag: &str, shown: &str, rel: &str, full: &Path) -> anyhow::Result<()> {
        let norm =
            normalize(rel, &ANY_PATH).map_err(|m| anyhow!("{flag} {shown}: {rel:?}: {m}"))?;
        self.tree
            .add(&norm)
            .map_err(|m| anyhow!("{flag} {shown}: {norm:?}: {m}"))?;
        if self.files.len() >= MAX_INPUT_FILES {
            bail!("{flag} {shown}: more than {MAX_INPUT_FILES} files in all");
        }
        let size = std::fs::metadata(full)
            .with_context(|| format!("{flag} {shown}: cannot read {}", full.display()))?
            .len();
        self.bytes = self.bytes.saturating_add(size);
        if self.bytes > MAX_INPUT_BYTES {
            bail!("{flag} {shown}: the inputs hold more than {MAX_INPUT_BYTES} bytes in all");
        }
        let data = std::fs::read(full)
            .with_context(|| format!("{flag} {shown}: cannot read {}", full.display()))?;
        let value = match String::from_utf8(data) {
            Ok(text) if !text.contains('\0') => Value::String(text),
            Ok(text) => json!({"base64": base64::engine::general_purpose::STANDARD.encode(text)}),
            Err(e) => {
                json!({"base64": base64::engine::general_purpose::STANDARD.encode(e.into_bytes())})
            }
        };
        self.files.insert(norm, value);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn inputs_keep_relative_places_and_skip_links() {
        assert_eq!(
            input_place(Path::new("src/main.rs")).unwrap(),
            "src/main.rs"
        );
        assert_eq!(input_place(Path::new("./a.txt")).unwrap(), "a.txt");
        assert_eq!(input_place(Path::new("/tmp/x/a.txt")).unwrap(), "a.txt");
        assert_eq!(input_place(Path::new("../a.txt")).unwrap(), "a.txt");

        let root = tempfile::tempdir().unwrap();
        let d = root.path();
        std::fs::create_dir_all(d.join("sub/.git")).unwrap();
        std::fs::write(d.join("a.txt"), "text").unwrap();
        std::fs::write(d.join("sub/b.bin"), [0u8, 159, 146, 150]).unwrap();
        std::fs::write(d.join("sub/.git/config"), "x").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", d.join("passwd")).unwrap();
        let files = collect_inputs(&[], &[d.to_path_buf()]).unwrap();
        let keys: Vec<&String> = files.keys().collect();
        assert_eq!(keys, ["a.txt", "sub/b.bin"]);
        assert_eq!(files["a.txt"], "text");
        assert_eq!(files["sub/b.bin"], json!({"base64": "AJ+Slg=="}));
        // The same file twice is an error naming the flag.
        let e = collect_inputs(&[d.join("a.txt")], &[d.to_path_buf()]).unwrap_err();
        assert!(e.to_string().starts_with("--input-dir"), "{e}");
        let e = collect_inputs(&[d.join("nope")], &[]).unwrap_err();
        assert!(e.to_string().starts_with("--input "), "{e}");
        let e = collect_inputs(&[], &[d.join("a.txt")]).unwrap_err();
        assert!(e.to_string().starts_with("--input-dir "), "{e}");
    }
}
