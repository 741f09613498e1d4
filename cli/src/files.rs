//! A session's files from the command line: `agentq files ID [PATH] [-o DIR]` (list them,
//! print one, or save one or all of them into DIR), and the `files` of `agentq submit
//! --input PATH… --input-dir DIR…`.
//!
//! What the server sends is written only inside DIR: every path is held to the same rules
//! the API holds a request's paths to, a tar entry that is not a regular file is refused,
//! and nothing is written through a symbolic link or over a directory (each file is
//! written beside its place and renamed onto it, which replaces a link rather than
//! following it).

use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use base64::Engine as _;
use clap::Args;
use serde_json::{Map, Value, json};

use agentq_api::FileList;
use agentq_core::workspace_path::{
    FileLimits, MAX_INPUT_BYTES, MAX_INPUT_FILES, MAX_PATH_BYTES, MAX_PATH_DEPTH, Tree, normalize,
};

use crate::client::{Api, ApiArgs};

/// The widest paths any server accepts: it judges a request's paths by its own policy.
const ANY_PATH: FileLimits = FileLimits {
    max_path_bytes: MAX_PATH_BYTES,
    max_path_depth: MAX_PATH_DEPTH,
    ..FileLimits::DEFAULT
};

#[derive(Args, Debug)]
pub struct FilesArgs {
    /// The session (any session of a tree shows the tree's files).
    pub id: String,
    /// One file: printed to stdout, or saved under -o DIR.
    pub path: Option<String>,
    /// Save into this directory (created if missing): PATH alone, or without PATH every
    /// file of the workspace.
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Print the API's JSON instead of a table.
    #[arg(long, conflicts_with_all = ["path", "output"])]
    pub json: bool,
    #[command(flatten)]
    pub api: ApiArgs,
}

/// `agentq files`
pub async fn files(args: FilesArgs) -> anyhow::Result<ExitCode> {
    let api = Api::new(&args.api)?;
    let id = encode_segment(&args.id);
    match (&args.path, &args.output) {
        (None, None) => {
            let list: FileList = api.get(&format!("/v1/sessions/{id}/files")).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                print_list(&list);
            }
        }
        (Some(path), out) => {
            let norm = normalize(path, &ANY_PATH).map_err(|m| anyhow!("PATH {path:?}: {m}"))?;
            let url = format!("/v1/sessions/{id}/files/{}", encode_path(&norm));
            let bytes = api.get_bytes(&url).await?;
            match out {
                None => {
                    let mut stdout = std::io::stdout().lock();
                    stdout.write_all(&bytes).context("cannot write to stdout")?;
                    stdout.flush().context("cannot write to stdout")?;
                }
                Some(dir) => {
                    prepare_dir(dir)?;
                    write_inside(dir, &norm, &bytes)?;
                    eprintln!("saved {}", dir.join(&norm).display());
                }
            }
        }
        (None, Some(dir)) => {
            let tar = api
                .get_bytes(&format!("/v1/sessions/{id}/files?format=tar"))
                .await?;
            prepare_dir(dir)?;
            let n = unpack(&tar, dir)?;
            eprintln!("saved {n} files into {}", dir.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn print_list(list: &FileList) {
    if list.files.is_empty() {
        eprintln!("(no files)");
        return;
    }
    let width = list
        .files
        .iter()
        .map(|f| f.size.to_string().len())
        .max()
        .unwrap_or(4)
        .max(4);
    println!("{:>width$}  {:<12}  {:>5}  PATH", "SIZE", "SHA256", "SEQ");
    for f in &list.files {
        println!(
            "{:>width$}  {:<12}  {:>5}  {}",
            f.size,
            f.sha256.get(..12).unwrap_or(&f.sha256),
            f.modified_at_seq,
            f.path.escape_debug()
        );
    }
}

fn prepare_dir(dir: &Path) -> anyhow::Result<()> {
    if let Ok(m) = std::fs::symlink_metadata(dir)
        && !m.is_dir()
    {
        bail!("-o {}: exists and is not a directory", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("-o {}: cannot create it", dir.display()))
}

/// Unpack a tar of the API into `dir`: regular files only, each path held to the rules,
/// no two entries for one file. Returns the files written.
fn unpack(tar_bytes: &[u8], dir: &Path) -> anyhow::Result<usize> {
    let mut archive = tar::Archive::new(tar_bytes);
    let mut tree = Tree::default();
    let mut n = 0usize;
    for entry in archive.entries().context("the answer is not a tar")? {
        let mut e = entry.context("the answer is not a valid tar")?;
        let raw = e.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let kind = e.header().entry_type();
        match kind {
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            // Directories come from the files' paths.
            tar::EntryType::Directory => continue,
            other => bail!("refusing tar entry {name:?}: a {other:?} entry is not a regular file"),
        }
        let path = std::str::from_utf8(&raw)
            .map_err(|_| anyhow!("refusing tar entry {name:?}: not UTF-8"))?;
        let norm =
            normalize(path, &ANY_PATH).map_err(|m| anyhow!("refusing tar entry {name:?}: {m}"))?;
        tree.add(&norm)
            .map_err(|m| anyhow!("refusing tar entry {name:?}: {m}"))?;
        let mut data = Vec::new();
        e.read_to_end(&mut data)
            .with_context(|| format!("cannot read tar entry {name:?}"))?;
        write_inside(dir, &norm, &data)?;
        n = n.saturating_add(1);
    }
    Ok(n)
}

/// Write `data` at `rel` (normalised) under `dir`, creating directories on the way, never
/// through a symbolic link and never over a directory.
fn write_inside(dir: &Path, rel: &str, data: &[u8]) -> anyhow::Result<()> {
    let mut at = dir.to_path_buf();
    let segs: Vec<&str> = rel.split('/').collect();
    let (last, parents) = segs.split_last().ok_or_else(|| anyhow!("an empty path"))?;
    for seg in parents {
        at.push(seg);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => bail!(
                "refusing to write {rel:?}: {} is not a directory (a file or a symbolic link)",
                at.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::create_dir(&at)
                .with_context(|| format!("cannot create {}", at.display()))?,
            Err(e) => return Err(e).with_context(|| format!("cannot inspect {}", at.display())),
        }
    }
    let target = at.join(last);
    if let Ok(m) = std::fs::symlink_metadata(&target)
        && m.is_dir()
    {
        bail!(
            "refusing to write {rel:?}: {} is a directory",
            target.display()
        );
    }
    // A new file beside the target (create_new refuses to follow or reuse anything
    // there), renamed onto it: a symbolic link at the target is replaced, not followed.
    let tmp = at.join(format!(".{last}.agentq-{}", std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &target)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        anyhow!("cannot write {}: {e}", target.display())
    })
}

/// Percent-encode one path segment (or an id).
fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A normalised workspace path in a URL: each segment encoded, `/` kept.
fn encode_path(p: &str) -> String {
    p.split('/')
        .map(encode_segment)
        .collect::<Vec<_>>()
        .join("/")
}

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

    fn tar_of(entries: &[(&str, tar::EntryType, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(*kind);
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            // Written raw: the builder itself refuses `..`, an attacker's server would not.
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name.as_bytes());
            h.set_cksum();
            b.append(&h, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    #[test]
    fn a_hostile_tar_writes_nothing_outside() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("out");
        std::fs::create_dir(&dir).unwrap();
        let reg = tar::EntryType::Regular;
        for (name, kind) in [
            ("../escape.txt", reg),
            ("/abs.txt", reg),
            ("a/../../escape.txt", reg),
            (".git/hooks/post-checkout", reg),
            ("link", tar::EntryType::Symlink),
            ("hard", tar::EntryType::Link),
            ("dev", tar::EntryType::Char),
        ] {
            let t = tar_of(&[("ok.txt", reg, b"ok"), (name, kind, b"x")]);
            let e = unpack(&t, &dir).unwrap_err();
            assert!(e.to_string().contains("refusing tar entry"), "{name}: {e}");
        }
        let t = tar_of(&[("a", reg, b"1"), ("a/b", reg, b"2")]);
        assert!(unpack(&t, &dir).is_err());
        assert!(!root.path().join("escape.txt").exists());
        assert!(!root.path().join("abs.txt").exists());

        // A link planted in DIR is replaced, never written through.
        let victim = root.path().join("victim.txt");
        std::fs::write(&victim, "keep").unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("f.txt")).unwrap();
        std::os::unix::fs::symlink(root.path(), dir.join("sub")).unwrap();
        let t = tar_of(&[("f.txt", reg, b"new")]);
        assert_eq!(unpack(&t, &dir).unwrap(), 1);
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(dir.join("f.txt")).unwrap(), "new");
        let t = tar_of(&[("sub/victim.txt", reg, b"owned")]);
        assert!(unpack(&t, &dir).is_err());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
    }

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
