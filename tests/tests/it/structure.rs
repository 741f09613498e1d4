//! The shape of the source tree, checked: no source file over 800 lines, no function over
//! 100, no circle of `use`s between the files of one crate. Test code (a crate's `tests/`,
//! a `tests.rs` module, an inline `#[cfg(test)]` block) is not held to the line limits.
//!
//! The scan is lexical on purpose (comments and literals blanked, braces matched): it needs
//! no parser, and a file it misreads is one a reader would misread too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use agentq_testkit::{repo_root, rust_files};

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 100;

/// The workspace's crates: each member directory with a `src/`.
fn crates() -> Vec<PathBuf> {
    let root = repo_root();
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let members = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("the workspace lists its members");
    members
        .split('"')
        .skip(1)
        .step_by(2)
        .map(|m| root.join(m))
        .filter(|d| d.join("src").is_dir())
        .collect()
}

/// A crate's source files, test modules left out.
fn source_files(krate: &Path) -> Vec<PathBuf> {
    let mut files = rust_files(&krate.join("src"));
    files.retain(|f| {
        f.file_name().is_some_and(|n| n != "tests.rs")
            && !f.components().any(|c| c.as_os_str() == "tests")
    });
    files
}

/// The text with comments, string and char literals replaced by spaces (newlines kept),
/// so braces and `use`s are only those of the code.
fn blank(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let keep_lines = |out: &mut Vec<u8>, s: &[u8]| {
        out.extend(s.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }));
    };
    while i < b.len() {
        let rest = &b[i..];
        let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            keep_lines(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            let mut depth = 0usize;
            let mut j = 0;
            while j < rest.len() {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            keep_lines(&mut out, &rest[..j]);
            i += j;
        } else if !ident_before && raw_string_start(rest).is_some() {
            let (open, hashes) = raw_string_start(rest).unwrap();
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let end = rest[open..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(rest.len(), |p| open + p + close.len());
            keep_lines(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            keep_lines(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'\'' && !ident_before {
            match char_literal_len(rest) {
                Some(n) => {
                    keep_lines(&mut out, &rest[..n]);
                    i += n;
                }
                None => {
                    out.push(b'\'');
                    i += 1;
                }
            }
        } else {
            out.push(rest[0]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap()
}

/// `r"`, `r#"`, `br"`…: the length of the opening and the number of `#`.
fn raw_string_start(s: &[u8]) -> Option<(usize, usize)> {
    let mut j = 0;
    if s.first() == Some(&b'b') {
        j += 1;
    }
    if s.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = s[j..].iter().take_while(|&&c| c == b'#').count();
    j += hashes;
    (s.get(j) == Some(&b'"')).then_some((j + 1, hashes))
}

/// A char literal's length (`'a'`, `'\n'`, `'\u{1F600}'`), or `None` for a lifetime.
fn char_literal_len(s: &[u8]) -> Option<usize> {
    if s.get(1) == Some(&b'\\') {
        let close = s.iter().skip(2).position(|&c| c == b'\'')?;
        return (close < 12).then_some(close + 3);
    }
    let text = std::str::from_utf8(&s[1..s.len().min(6)])
        .ok()
        .or_else(|| {
            (1..s.len().min(6))
                .rev()
                .find_map(|n| std::str::from_utf8(&s[1..n]).ok())
        })?;
    let c = text.chars().next()?;
    (s.get(1 + c.len_utf8()) == Some(&b'\'')).then_some(2 + c.len_utf8())
}

/// Byte ranges of `#[cfg(test)]` items (their whole braced body).
fn test_blocks(code: &str) -> Vec<(usize, usize)> {
    let mut blocks = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]") {
        let start = from + at;
        let Some(open) = code[start..].find(['{', ';']).map(|o| start + o) else {
            break;
        };
        let end = if code.as_bytes()[open] == b'{' {
            matching_brace(code, open)
        } else {
            open
        };
        blocks.push((start, end));
        from = end.max(start + 1);
    }
    blocks
}

fn matching_brace(code: &str, open: usize) -> usize {
    let mut depth = 0usize;
    for (i, c) in code.bytes().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    code.len()
}

fn line_of(code: &str, at: usize) -> usize {
    code[..at].bytes().filter(|&c| c == b'\n').count() + 1
}

/// Each function with a body: (name, first line, lines).
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("fn ") {
        let start = from + at;
        from = start + 3;
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        let name: String = code[start + 3..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body opens at the first `{` outside the signature's parentheses and
        // generics; a `;` first means a declaration without a body.
        let mut parens = 0i32;
        let mut open = None;
        for (i, c) in code.bytes().enumerate().skip(start) {
            match c {
                b'(' | b'[' => parens += 1,
                b')' | b']' => parens -= 1,
                b';' if parens == 0 => break,
                b'{' if parens == 0 => {
                    open = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let Some(open) = open else { continue };
        let close = matching_brace(code, open);
        let first = line_of(code, start);
        found.push((name, first, line_of(code, close) - first + 1));
    }
    found
}

fn relative(p: &Path) -> String {
    p.strip_prefix(repo_root())
        .unwrap_or(p)
        .display()
        .to_string()
}

#[test]
fn no_source_file_is_over_800_lines() {
    let mut long = Vec::new();
    for krate in crates() {
        for file in source_files(&krate) {
            let lines = std::fs::read_to_string(&file).unwrap().lines().count();
            if lines > MAX_FILE_LINES {
                long.push(format!("{} ({lines} lines)", relative(&file)));
            }
        }
    }
    assert!(
        long.is_empty(),
        "source files over {MAX_FILE_LINES} lines: {long:#?}"
    );
}

#[test]
fn no_function_is_over_100_lines() {
    let mut long = Vec::new();
    for krate in crates() {
        for file in source_files(&krate) {
            let code = blank(&std::fs::read_to_string(&file).unwrap());
            let tests = test_blocks(&code);
            for (name, first, lines) in functions(&code) {
                let in_test = tests
                    .iter()
                    .any(|&(s, e)| (line_of(&code, s)..=line_of(&code, e)).contains(&first));
                if lines > MAX_FN_LINES && !in_test {
                    long.push(format!(
                        "{}:{first} {name} ({lines} lines)",
                        relative(&file)
                    ));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines: {long:#?}"
    );
}

/// A test binary made of a directory (`tests/it/main.rs`, `tests/e2e/main.rs`): a file put
/// beside its `main.rs` without a `mod` line there is never compiled, and its tests never
/// run, silently.
#[test]
fn every_file_of_a_test_binary_directory_is_one_of_its_modules() {
    let mut unwired = Vec::new();
    for krate in crates() {
        let Ok(entries) = std::fs::read_dir(krate.join("tests")) else {
            continue;
        };
        for dir in entries.map(|e| e.unwrap().path()) {
            let Ok(main) = std::fs::read_to_string(dir.join("main.rs")) else {
                continue;
            };
            let declared: BTreeSet<&str> = main
                .lines()
                .filter_map(|l| l.trim().strip_prefix("mod "))
                .filter_map(|l| l.strip_suffix(';'))
                .collect();
            for file in std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()) {
                let Some(stem) = file.file_stem().and_then(|s| s.to_str()) else {
                    continue;
                };
                let is_rs = file.extension().is_some_and(|e| e == "rs");
                if is_rs && stem != "main" && !declared.contains(stem) {
                    unwired.push(relative(&file));
                }
            }
        }
    }
    assert!(
        unwired.is_empty(),
        "files no test binary compiles (add `mod NAME;` to the main.rs beside them): {unwired:?}"
    );
}

/// A crate's module tree: module path (`a::b`) to its file.
fn module_files(krate: &Path, files: &[PathBuf]) -> BTreeMap<String, PathBuf> {
    let src = krate.join("src");
    let mut modules = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap().with_extension("");
        let mut parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        modules.insert(parts.join("::"), f.clone());
    }
    modules
}

/// The paths a file names inside its crate, made absolute (`a::b::C`): `crate::…`,
/// `super::…`, `self::…`, and names of the crate's top-level modules used bare in a `use`.
fn crate_paths(code: &str, module: &str, top: &BTreeSet<String>) -> Vec<Vec<String>> {
    let here: Vec<String> = if module.is_empty() {
        Vec::new()
    } else {
        module.split("::").map(str::to_string).collect()
    };
    let mut paths = Vec::new();
    for stmt in use_statements(code) {
        for path in expand_use(&stmt) {
            if let Some(abs) = absolute(&path, &here, top, true) {
                paths.push(abs);
            }
        }
    }
    // Paths in expressions and types: `crate::x::Y`, `super::x::Y`.
    for anchor in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(anchor) {
            let start = from + at;
            from = start + anchor.len();
            let prev = code[..start].chars().next_back();
            if prev.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let path: Vec<String> = code[start..]
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .next()
                .unwrap_or("")
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            if let Some(abs) = absolute(&path, &here, top, false) {
                paths.push(abs);
            }
        }
    }
    paths
}

fn use_statements(code: &str) -> Vec<String> {
    let mut stmts = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("use ") {
        let start = from + at;
        from = start + 4;
        let prev = code[..start].chars().next_back();
        if prev.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(end) = code[start..].find(';') {
            stmts.push(code[start + 4..start + end].split_whitespace().collect());
        }
    }
    stmts
}

/// `a::{b, c::{d, e}}` into `a::b`, `a::c::d`, `a::c::e` (each as its segments).
fn expand_use(stmt: &str) -> Vec<Vec<String>> {
    fn go(prefix: &[String], s: &str, out: &mut Vec<Vec<String>>) {
        let s = s.trim();
        if let Some(open) = s.find('{') {
            let head: Vec<String> = s[..open]
                .split("::")
                .filter(|p| !p.is_empty())
                .map(str::to_string)
                .collect();
            let mut p = prefix.to_vec();
            p.extend(head);
            let inner = &s[open + 1..s.rfind('}').unwrap_or(s.len())];
            let mut depth = 0;
            let mut part = String::new();
            for c in inner.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        go(&p, &part, out);
                        part.clear();
                        continue;
                    }
                    _ => {}
                }
                part.push(c);
            }
            if !part.trim().is_empty() {
                go(&p, &part, out);
            }
        } else {
            let s = s.split(" as ").next().unwrap_or(s);
            let mut p = prefix.to_vec();
            p.extend(s.split("::").filter(|x| !x.is_empty()).map(str::to_string));
            out.push(p);
        }
    }
    let stmt = stmt.strip_prefix("pub(crate)").unwrap_or(stmt);
    let mut out = Vec::new();
    go(&[], stmt, &mut out);
    out
}

fn absolute(
    path: &[String],
    here: &[String],
    top: &BTreeSet<String>,
    in_use: bool,
) -> Option<Vec<String>> {
    let first = path.first()?;
    let mut abs: Vec<String> = match first.as_str() {
        "crate" => Vec::new(),
        "self" => here.to_vec(),
        "super" => {
            let mut base = here.to_vec();
            let mut rest = path;
            while rest.first().is_some_and(|s| s == "super") {
                base.pop()?;
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            return Some(base);
        }
        name if in_use && here.is_empty() && top.contains(name) => {
            return Some(path.to_vec());
        }
        _ => return None,
    };
    abs.extend(path[1..].iter().cloned());
    Some(abs)
}

/// The modules `path` leads to: its longest prefix that is a module and, when the name is
/// that module's re-export (`pub use`), the module that defines it too. A re-export is an
/// import of its own: a file that takes a name through `a/mod.rs` depends on `a/mod.rs`.
fn resolve(
    path: &[String],
    modules: &BTreeMap<String, PathBuf>,
    reexports: &BTreeMap<String, BTreeMap<String, Vec<String>>>,
    out: &mut Vec<String>,
) {
    let mut n = path.len();
    while n > 0 && !modules.contains_key(&path[..n].join("::")) {
        n -= 1;
    }
    let module = path[..n].join("::");
    if !modules.contains_key(&module) || out.contains(&module) {
        return;
    }
    out.push(module.clone());
    if let Some(name) = path.get(n)
        && let Some(target) = reexports.get(&module).and_then(|r| r.get(name))
    {
        let mut next = target.clone();
        next.extend(path[n + 1..].iter().cloned());
        resolve(&next, modules, reexports, out);
    }
}

#[test]
fn no_import_circle_between_the_files_of_a_crate() {
    let mut circles = Vec::new();
    for krate in crates() {
        let files = source_files(&krate);
        let modules = module_files(&krate, &files);
        let top: BTreeSet<String> = modules
            .keys()
            .filter(|m| !m.is_empty() && !m.contains("::"))
            .cloned()
            .collect();
        let codes: BTreeMap<&String, String> = modules
            .iter()
            .map(|(m, f)| {
                let code = blank(&std::fs::read_to_string(f).unwrap());
                let tests = test_blocks(&code);
                let mut kept = code.clone().into_bytes();
                let last = kept.len().saturating_sub(1);
                for (s, e) in tests {
                    kept[s..=e.min(last)].fill(b' ');
                }
                (m, String::from_utf8(kept).unwrap())
            })
            .collect();
        // `pub use` lines: what a module re-exports, by name.
        let mut reexports: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
        for (m, code) in &codes {
            let here: Vec<String> = if m.is_empty() {
                Vec::new()
            } else {
                m.split("::").map(str::to_string).collect()
            };
            for line in code.lines() {
                let Some(rest) = line.trim_start().strip_prefix("pub use ") else {
                    continue;
                };
                let stmt: String = rest.trim_end_matches(';').split_whitespace().collect();
                for path in expand_use(&stmt) {
                    let Some(abs) = absolute(&path, &here, &top, true).or_else(|| {
                        let mut p = here.clone();
                        p.extend(path.iter().cloned());
                        modules
                            .contains_key(&p[..p.len() - 1].join("::"))
                            .then_some(p)
                    }) else {
                        continue;
                    };
                    if let Some(name) = abs.last() {
                        reexports
                            .entry((*m).clone())
                            .or_default()
                            .insert(name.clone(), abs.clone());
                    }
                }
            }
        }
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (m, code) in &codes {
            for path in crate_paths(code, m, &top) {
                let mut targets = Vec::new();
                resolve(&path, &modules, &reexports, &mut targets);
                for target in targets {
                    // The crate root and a file's own ancestors hold what their children
                    // share; a child naming them is not a circle.
                    if target != **m && !target.is_empty() && !m.starts_with(&format!("{target}::"))
                    {
                        edges.entry((*m).clone()).or_default().insert(target);
                    }
                }
            }
        }
        for cycle in cycles(&edges) {
            let names: Vec<String> = cycle.iter().map(|m| relative(&modules[m])).collect();
            circles.push(names.join(" -> "));
        }
    }
    assert!(
        circles.is_empty(),
        "files that import each other: {circles:#?}"
    );
}

/// One cycle per strongly connected component of more than one file.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let nodes: BTreeSet<&String> = edges
        .iter()
        .flat_map(|(a, bs)| std::iter::once(a).chain(bs.iter()))
        .collect();
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(n) = stack.pop() {
            for m in edges.get(&n).into_iter().flatten() {
                if seen.insert(m.clone()) {
                    stack.push(m.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> =
        nodes.iter().map(|n| (*n, reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(*n) || !reachable[n].contains(*n) {
            continue;
        }
        let component: Vec<String> = nodes
            .iter()
            .filter(|m| reachable[n].contains(**m) && reachable[**m].contains(*n))
            .map(|m| (*m).clone())
            .collect();
        done.extend(component.iter().cloned());
        out.push(component);
    }
    out
}
