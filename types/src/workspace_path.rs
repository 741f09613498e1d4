//! The rules a workspace path must follow wherever one crosses a trust boundary: a file
//! a request brings in, a path asked for through the API, an entry of a tar the CLI
//! unpacks. One function ([`normalize`]) turns a path into the one spelling a tree stores
//! (or refuses it, saying why), and [`Tree`] holds a set of them to the rules that span
//! paths: no two spell the same file, and no file is also a directory.
//!
//! What is refused, and why: anything that could name a place outside the workspace
//! (absolute paths, `..`, a backslash that another platform reads as a separator, a
//! drive letter); anything a file system would read differently from the text (empty
//! segments, NUL and control characters, invisible format characters that make two names
//! look alike); and a `.git` segment in any spelling a file system folds to it (`.GIT`,
//! `.git.`, `.git `), since a `.git` directory planted in a workspace is configuration
//! that `git` runs (hooks) when a tool calls it there.

use std::collections::BTreeSet;

/// Most files one request may bring under any policy: what one object of a request body
/// may hold as `files`.
pub const MAX_INPUT_FILES: usize = 10_000;
/// Most bytes (decoded) one request's files may hold under any policy: base64-encoded,
/// they still fit in a batch body (32 MiB) with room for the rest of the request.
pub const MAX_INPUT_BYTES: u64 = 16 * 1024 * 1024;
/// Longest path any bound may allow (bytes).
pub const MAX_PATH_BYTES: usize = 4096;
/// Deepest path any bound may allow (segments).
pub const MAX_PATH_DEPTH: usize = 128;
/// Longest single segment: what common file systems store (`NAME_MAX`).
pub const MAX_SEGMENT_BYTES: usize = 255;

/// What a request's files may hold: the operator's policy narrows the API's hard bounds
/// (`max_input_*` and `max_path_*` of `[policy]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileLimits {
    /// Files of one request.
    pub max_files: usize,
    /// Bytes of all files of one request, decoded.
    pub max_bytes: u64,
    /// Longest path (bytes, as sent).
    pub max_path_bytes: usize,
    /// Deepest path (segments).
    pub max_path_depth: usize,
}

impl FileLimits {
    /// The defaults of `[policy]`: 1,000 files and 10 MiB per request, paths of at most
    /// 1 KiB and 32 segments.
    pub const DEFAULT: FileLimits = FileLimits {
        max_files: 1_000,
        max_bytes: 10 * 1024 * 1024,
        max_path_bytes: 1024,
        max_path_depth: 32,
    };
}

impl Default for FileLimits {
    fn default() -> Self {
        FileLimits::DEFAULT
    }
}

/// Characters that render as nothing (or reorder what follows) and so make two different
/// names look the same, or one name look like another.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}'
        | '\u{17B5}' | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}'
        | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{3164}'
        | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}' | '\u{FFF0}'..='\u{FFF8}'
        | '\u{E0000}'..='\u{E0FFF}')
}

/// `seg` read the way case-insensitive file systems that drop trailing dots and spaces
/// (Windows, macOS by default) read it, for the `.git` check.
fn is_git(seg: &str) -> bool {
    seg.trim_end_matches(['.', ' '])
        .eq_ignore_ascii_case(".git")
}

/// `path` in the one spelling a tree stores: `/`-separated segments, `.` segments
/// dropped. Refused (the reason is returned, for a message that names the field): see
/// the module docs; beyond `limits`, a segment longer than [`MAX_SEGMENT_BYTES`].
pub fn normalize(path: &str, limits: &FileLimits) -> Result<String, String> {
    let max_bytes = limits.max_path_bytes.min(MAX_PATH_BYTES);
    let max_depth = limits.max_path_depth.min(MAX_PATH_DEPTH);
    if path.is_empty() {
        return Err("a path must not be empty".into());
    }
    if path.len() > max_bytes {
        return Err(format!(
            "a path is at most {max_bytes} bytes, this one is {}",
            path.len()
        ));
    }
    if let Some(c) = path.chars().find(|c| c.is_control()) {
        return Err(format!(
            "a path must not contain control characters (found U+{:04X})",
            u32::from(c)
        ));
    }
    if let Some(c) = path.chars().find(|c| invisible(*c)) {
        return Err(format!(
            "a path must not contain invisible characters (found U+{:04X})",
            u32::from(c)
        ));
    }
    if path.contains('\\') {
        return Err("a path separates its parts with `/`, never `\\`".into());
    }
    if path.starts_with('/') {
        return Err("a path must be relative to the workspace (no leading `/`)".into());
    }
    let bytes = path.as_bytes();
    if bytes.len() >= 2 && bytes[0].is_ascii_alphabetic() && bytes[1] == b':' {
        return Err("a path must be relative to the workspace (no drive letter)".into());
    }
    let mut out: Vec<&str> = Vec::new();
    for seg in path.split('/') {
        match seg {
            "" => return Err("a path must not have empty parts (`//` or a trailing `/`)".into()),
            "." => continue,
            ".." => return Err("a path must not contain `..`".into()),
            s if s.len() > MAX_SEGMENT_BYTES => {
                return Err(format!(
                    "each part of a path is at most {MAX_SEGMENT_BYTES} bytes"
                ));
            }
            s if is_git(s) => {
                return Err("a path must not contain a `.git` directory or file".into());
            }
            s => out.push(s),
        }
    }
    if out.is_empty() {
        return Err("a path must name a file, not the workspace itself".into());
    }
    if out.len() > max_depth {
        return Err(format!(
            "a path is at most {max_depth} parts deep, this one has {}",
            out.len()
        ));
    }
    Ok(out.join("/"))
}

/// Normalised paths added one by one, refusing a second spelling of a file already there
/// and a file that is also a directory of another (`a` and `a/b`).
#[derive(Debug, Default)]
pub struct Tree {
    files: BTreeSet<String>,
    dirs: BTreeSet<String>,
}

impl Tree {
    /// Add `path` (normalised); the reason when it clashes with one added before.
    pub fn add(&mut self, path: &str) -> Result<(), String> {
        if self.files.contains(path) {
            return Err("another entry names the same file".into());
        }
        if self.dirs.contains(path) {
            return Err("another file lies under this path, so it is a directory".into());
        }
        let mut parents = Vec::new();
        let mut at = 0;
        while let Some(i) = path[at..].find('/') {
            let parent = &path[..at + i];
            if self.files.contains(parent) {
                return Err(format!(
                    "`{parent}` is a file, so it cannot hold other files"
                ));
            }
            parents.push(parent);
            at += i + 1;
        }
        for p in parents {
            self.dirs.insert(p.to_string());
        }
        self.files.insert(path.to_string());
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.files.len()
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn n(p: &str) -> Result<String, String> {
        normalize(p, &FileLimits::DEFAULT)
    }

    #[test]
    fn good_paths_normalise_to_one_spelling() {
        assert_eq!(n("a.txt").unwrap(), "a.txt");
        assert_eq!(n("src/main.rs").unwrap(), "src/main.rs");
        assert_eq!(n("./a/./b").unwrap(), "a/b");
        assert_eq!(n("a/.gitignore").unwrap(), "a/.gitignore");
        assert_eq!(n(".github/ci.yml").unwrap(), ".github/ci.yml");
        assert_eq!(n("...").unwrap(), "...");
        assert_eq!(n("名前/ファイル.txt").unwrap(), "名前/ファイル.txt");
        // A name that reads like a link is an ordinary name.
        assert_eq!(n("a -> x").unwrap(), "a -> x");
        assert_eq!(n("~/x").unwrap(), "~/x");
    }

    #[test]
    fn escapes_and_tricks_are_refused() {
        for bad in [
            "",
            ".",
            "./.",
            "/etc/passwd",
            "//x",
            "../x",
            "a/../../x",
            "a/..",
            "a//b",
            "a/",
            "a\\..\\b",
            "C:/Windows",
            "c:x",
            "a\0b",
            "a\nb",
            "a\u{1b}[2Jb",
            "a\u{7f}",
            "a\u{202e}txt.exe",
            "a\u{200b}b",
            "\u{feff}a",
            ".git/hooks/pre-commit",
            "x/.GIT/config",
            ".git",
            ".git./config",
            ".git /config",
            "sub/.Git../hooks",
        ] {
            assert!(n(bad).is_err(), "{bad:?} was accepted as {:?}", n(bad));
        }
        let long_seg = "x".repeat(MAX_SEGMENT_BYTES + 1);
        assert!(n(&long_seg).is_err());
        assert!(n(&"x".repeat(MAX_SEGMENT_BYTES)).is_ok());
    }

    #[test]
    fn length_and_depth_follow_the_limits_and_never_pass_the_hard_ones() {
        let l = FileLimits {
            max_path_bytes: 10,
            max_path_depth: 2,
            ..FileLimits::DEFAULT
        };
        assert!(normalize("abcdefghij", &l).is_ok());
        assert!(
            normalize("abcdefghijk", &l)
                .unwrap_err()
                .contains("10 bytes")
        );
        assert!(normalize("a/b", &l).is_ok());
        assert!(normalize("a/b/c", &l).unwrap_err().contains("2 parts"));
        // `.` parts do not count towards the depth.
        assert!(normalize("./a/./b", &l).is_ok());
        let wide = FileLimits {
            max_path_bytes: usize::MAX,
            max_path_depth: usize::MAX,
            ..FileLimits::DEFAULT
        };
        let deep = format!("{}b", "a/".repeat(MAX_PATH_DEPTH));
        assert!(normalize(&deep, &wide).unwrap_err().contains("parts deep"));
        assert!(normalize(&"x".repeat(100 * 1024), &wide).is_err());
    }

    #[test]
    fn trees_refuse_twins_and_file_directory_clashes() {
        let mut t = Tree::default();
        t.add("a/b").unwrap();
        t.add("a/c").unwrap();
        t.add("b").unwrap();
        assert!(t.add("a/b").unwrap_err().contains("same file"));
        assert!(t.add("a").unwrap_err().contains("directory"));
        assert!(t.add("b/c").unwrap_err().contains("`b` is a file"));
        assert!(t.add("a/b/c").unwrap_err().contains("`a/b` is a file"));
        t.add("ab").unwrap();
        t.add("a.b").unwrap();
        assert_eq!(t.len(), 5);
        // Twins after normalisation.
        let mut t = Tree::default();
        t.add(&n("a/./b").unwrap()).unwrap();
        assert!(t.add(&n("a/b").unwrap()).is_err());
    }
}
