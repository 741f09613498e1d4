//! A session's files from the command line: `agentq files ID [PATH] [-o DIR]` (list them,
//! print one, or save one or all of them into DIR). The files a submit sends are
//! `crate::inputs`.
//!
//! What the server sends is written only inside DIR: every path is held to the same rules
//! the API holds a request's paths to, a tar entry that is not a regular file is refused,
//! and nothing is written through a symbolic link or over a directory (each file is
//! written beside its place and renamed onto it, which replaces a link rather than
//! following it).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow, bail};
use clap::Args;

use agentq_api::FileList;
use agentq_core::workspace_path::{Tree, normalize};

use crate::client::api::{Api, ApiArgs};
use crate::inputs::ANY_PATH;

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
}
