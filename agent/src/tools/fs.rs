//! The workspace file tools: `read_file`, `write_file`, `edit_file`, `list_dir`, `glob` and
//! `grep`. They reach files only through [`Workspace`](super::Workspace), which confines
//! every path to the workspace root. Also owns the argument-parsing helpers all built-in
//! tools share ([`Args`]).

use async_trait::async_trait;
use globset::{GlobBuilder, GlobMatcher};
use regex::RegexBuilder;
use serde_json::{Map, Value, json};

use super::workspace::{EntryKind, WriteLimits};
use super::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};

/// Default number of lines `read_file` returns.
const READ_DEFAULT_LIMIT: u64 = 2000;
/// Longer lines are cut when shown by `read_file` and `grep` (minified files, data blobs).
const MAX_LINE_CHARS: usize = 2000;
const GREP_MAX_LINE_CHARS: usize = 500;
/// Bytes inspected for a NUL to call a file binary (what git and grep do).
const BINARY_SNIFF_BYTES: usize = 8000;
/// `edit_file` must see the whole file; above this it refuses rather than risk writing
/// back a truncated file.
const EDIT_MAX_BYTES: usize = 16 * 1024 * 1024;
const LIST_MAX_ENTRIES: usize = 1000;
const GLOB_MAX_RESULTS: usize = 1000;
const GREP_MAX_MATCHES: usize = 500;
/// Entries a `glob` or `grep` walk may visit, so a search of a huge tree stays bounded.
const WALK_MAX_ENTRIES: usize = 200_000;

/// A tool's arguments object, with accessors that name the offending field.
pub(crate) struct Args<'a> {
    map: &'a Map<String, Value>,
}

impl<'a> Args<'a> {
    /// Accept only an object whose fields are all in `known`. `{"_raw": …}` (arguments
    /// that were not valid JSON, see `ToolCall::parse_arguments`) is reported as such so
    /// the model resends them.
    pub(crate) fn parse(args: &'a Value, known: &[&str]) -> Result<Self, ToolError> {
        let map = args.as_object().ok_or_else(|| {
            ToolError::InvalidArguments(format!(
                "expected a JSON object of arguments, got {}",
                type_name(args)
            ))
        })?;
        if let Some(raw) = map.get("_raw")
            && !known.contains(&"_raw")
        {
            let text = raw.as_str().unwrap_or_default();
            return Err(ToolError::InvalidArguments(format!(
                "the arguments were not valid JSON ({}); resend them as a JSON object",
                snippet(text, 200)
            )));
        }
        if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
            return Err(ToolError::InvalidArguments(format!(
                "unknown field `{unknown}` (expected: {})",
                known.join(", ")
            )));
        }
        Ok(Args { map })
    }

    /// A field that is absent or `null` is absent: some models send `null` for optional
    /// fields.
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    pub(crate) fn str(&self, field: &str) -> Result<&'a str, ToolError> {
        self.opt_str(field)?
            .ok_or_else(|| ToolError::InvalidArguments(format!("missing field `{field}`")))
    }

    pub(crate) fn opt_str(&self, field: &str) -> Result<Option<&'a str>, ToolError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(wrong_type(field, "a string", other)),
        }
    }

    pub(crate) fn opt_u64(&self, field: &str) -> Result<Option<u64>, ToolError> {
        match self.get(field) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                // Models sometimes send numbers as strings.
                .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                .or_else(|| {
                    v.as_f64()
                        .filter(|f| *f >= 0.0 && f.fract() == 0.0)
                        .map(|f| f as u64)
                })
                .map(Some)
                .ok_or_else(|| wrong_type(field, "a non-negative integer", v)),
        }
    }

    pub(crate) fn opt_bool(&self, field: &str) -> Result<Option<bool>, ToolError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(Value::String(s)) if s == "true" || s == "false" => Ok(Some(s == "true")),
            Some(other) => Err(wrong_type(field, "a boolean", other)),
        }
    }

    pub(crate) fn opt_object(
        &self,
        field: &str,
    ) -> Result<Option<&'a Map<String, Value>>, ToolError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m)),
            Some(other) => Err(wrong_type(field, "an object", other)),
        }
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong_type(field: &str, expected: &str, got: &Value) -> ToolError {
    ToolError::InvalidArguments(format!(
        "field `{field}` must be {expected}, got {}",
        type_name(got)
    ))
}

/// The first `max` characters of `s`, marked when cut.
pub(crate) fn snippet(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The `path` string argument, if present, for [`Tool::paths`] (the firewall).
fn path_arg(args: &Value, field: &str) -> Vec<String> {
    args.get(field)
        .and_then(Value::as_str)
        .map(|p| vec![p.to_string()])
        .unwrap_or_default()
}

pub(crate) fn is_binary(data: &[u8]) -> bool {
    data[..data.len().min(BINARY_SNIFF_BYTES)].contains(&0)
}

/// `read_file {path, offset?, limit?}`: numbered lines of a text file.
pub struct ReadFile;

#[async_trait]
impl Tool for ReadFile {
    fn name(&self) -> &str {
        "read_file"
    }

    fn description(&self) -> &str {
        "Read a text file of the workspace. Returns numbered lines (`<n>\\t<text>`; the \
         number and tab are not part of the file). Use offset and limit to page through \
         long files."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace root."},
                "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based). Default 1."},
                "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines to return. Default 2000."}
            },
            "required": ["path"],
            "additionalProperties": false
        })
    }

    /// Only reads the workspace.
    fn side_effect(&self, _args: &Value) -> SideEffect {
        SideEffect::Pure
    }

    fn paths(&self, args: &Value) -> Vec<String> {
        path_arg(args, "path")
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a = Args::parse(&args, &["path", "offset", "limit"])?;
        let path = a.str("path")?;
        let offset = a.opt_u64("offset")?.unwrap_or(1);
        if offset == 0 {
            return Err(ToolError::InvalidArguments(
                "field `offset` is 1-based and must be at least 1".into(),
            ));
        }
        let limit = a.opt_u64("limit")?.unwrap_or(READ_DEFAULT_LIMIT);
        if limit == 0 {
            return Err(ToolError::InvalidArguments(
                "field `limit` must be at least 1".into(),
            ));
        }

        let cap = ctx.settings.read_max_bytes;
        let mut data = ctx.workspace.read(path, cap.saturating_add(1)).await?;
        let truncated = data.len() > cap;
        data.truncate(cap);
        if data.is_empty() {
            return Ok(ToolOutput::ok(format!("{path}: (empty file)")));
        }
        if is_binary(&data) {
            return Ok(ToolOutput::ok(format!(
                "{path}: binary file ({}{} bytes), not shown",
                data.len(),
                if truncated { "+" } else { "" }
            )));
        }

        let text = String::from_utf8_lossy(&data);
        let text = text.strip_suffix('\n').unwrap_or(&text);
        let lines: Vec<&str> = text.split('\n').collect();
        let total = lines.len() as u64;
        if offset > total {
            return Err(ToolError::Failed(format!(
                "offset {offset} is past the end of {path} ({total} lines{})",
                if truncated {
                    " read before the size cap"
                } else {
                    ""
                }
            )));
        }
        let start = offset - 1;
        let end = total.min(start.saturating_add(limit));
        let mut out = String::new();
        for (i, line) in lines[start as usize..end as usize].iter().enumerate() {
            let line = line.strip_suffix('\r').unwrap_or(line);
            let n = start + i as u64 + 1;
            out.push_str(&format!("{n:>6}\t{}\n", snippet(line, MAX_LINE_CHARS)));
        }
        if end < total {
            out.push_str(&format!(
                "[lines {offset}-{end} of {total}{} shown; pass offset={} to read on]\n",
                if truncated { "+" } else { "" },
                end + 1
            ));
        }
        if truncated {
            out.push_str(&format!(
                "[file truncated: only the first {cap} bytes were read (read_max_bytes); \
                 the last line shown may be incomplete]\n"
            ));
        }
        Ok(ToolOutput::ok(out))
    }
}

/// `write_file {path, content}`: create or replace a file. Idempotent: writing the same
/// content twice leaves the same file.
pub struct WriteFile;

#[async_trait]
impl Tool for WriteFile {
    fn name(&self) -> &str {
        "write_file"
    }

    fn description(&self) -> &str {
        "Create or overwrite a file of the workspace with the given content. Parent \
         directories are created as needed."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace root."},
                "content": {"type": "string", "description": "The complete new content of the file."}
            },
            "required": ["path", "content"],
            "additionalProperties": false
        })
    }

    fn side_effect(&self, _args: &Value) -> SideEffect {
        SideEffect::Idempotent
    }

    fn paths(&self, args: &Value) -> Vec<String> {
        path_arg(args, "path")
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a = Args::parse(&args, &["path", "content"])?;
        let path = a.str("path")?;
        let content = a.str("content")?;
        ctx.workspace
            .write(path, content.as_bytes(), WriteLimits::of(&ctx.settings))
            .await?;
        Ok(ToolOutput::ok(format!(
            "wrote {} bytes to {path}",
            content.len()
        )))
    }
}

/// `edit_file {path, old_string, new_string, replace_all?}`: exact-string replacement.
///
/// Declared `Unsafe`, not `Idempotent`: re-running an applied edit usually fails harmlessly
/// with "not found", but not always. When `new_string` contains `old_string` (appending to
/// a line) or the replacement recreates a match with its neighbours (`ab`→`a` in `abb`), a
/// second run edits the file again. Only the model, reading the file, can tell whether the
/// edit landed, so a lost result is reported as "outcome unknown".
pub struct EditFile;

#[async_trait]
impl Tool for EditFile {
    fn name(&self) -> &str {
        "edit_file"
    }

    fn description(&self) -> &str {
        "Replace an exact string in a file of the workspace. old_string must match the file \
         exactly (whitespace included) and occur exactly once, unless replace_all is true. \
         Include enough surrounding context to make it unique."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace root."},
                "old_string": {"type": "string", "description": "The exact text to replace. Must not be empty."},
                "new_string": {"type": "string", "description": "The replacement text. Must differ from old_string."},
                "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of exactly one. Default false."}
            },
            "required": ["path", "old_string", "new_string"],
            "additionalProperties": false
        })
    }

    fn side_effect(&self, _args: &Value) -> SideEffect {
        SideEffect::Unsafe
    }

    fn paths(&self, args: &Value) -> Vec<String> {
        path_arg(args, "path")
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a = Args::parse(&args, &["path", "old_string", "new_string", "replace_all"])?;
        let path = a.str("path")?;
        let old = a.str("old_string")?;
        let new = a.str("new_string")?;
        let replace_all = a.opt_bool("replace_all")?.unwrap_or(false);
        if old.is_empty() {
            return Err(ToolError::InvalidArguments(
                "field `old_string` must not be empty (use write_file to create a file)".into(),
            ));
        }
        if old == new {
            return Err(ToolError::InvalidArguments(
                "fields `old_string` and `new_string` are identical; nothing to do".into(),
            ));
        }

        let data = ctx
            .workspace
            .read(path, EDIT_MAX_BYTES.saturating_add(1))
            .await?;
        if data.len() > EDIT_MAX_BYTES {
            return Err(ToolError::Failed(format!(
                "{path} is larger than {EDIT_MAX_BYTES} bytes; edit_file refuses to rewrite it"
            )));
        }
        let text = String::from_utf8(data)
            .map_err(|_| ToolError::Failed(format!("{path} is not a UTF-8 text file")))?;
        let count = text.matches(old).count();
        if count == 0 {
            return Err(ToolError::Failed(format!(
                "old_string not found in {path} (it must match exactly, whitespace included; \
                 read the file to check)"
            )));
        }
        if count > 1 && !replace_all {
            return Err(ToolError::Failed(format!(
                "old_string occurs {count} times in {path}; include more context to make it \
                 unique, or set replace_all"
            )));
        }
        // The result's size follows from the counts: known, and checked against the cap,
        // before a byte of it is built (a replace_all of one character by a thousand
        // multiplies the file a thousandfold).
        let limits = WriteLimits::of(&ctx.settings);
        let replaced = if replace_all { count } else { 1 };
        limits.check_file(path, edited_len(text.len(), replaced, old.len(), new.len()))?;
        let updated = if replace_all {
            text.replace(old, new)
        } else {
            text.replacen(old, new, 1)
        };
        ctx.workspace
            .write(path, updated.as_bytes(), limits)
            .await?;
        Ok(ToolOutput::ok(format!(
            "replaced {count} occurrence{} in {path}",
            if count == 1 { "" } else { "s" }
        )))
    }
}

/// The length of a text of `len` bytes once `count` occurrences of `old` bytes are
/// replaced by `new` bytes; `None` past `u64`.
fn edited_len(len: usize, count: usize, old: usize, new: usize) -> Option<u64> {
    let wide = |n: usize| u64::try_from(n).ok();
    let removed = wide(count)?.checked_mul(wide(old)?)?;
    let added = wide(count)?.checked_mul(wide(new)?)?;
    wide(len)?.checked_sub(removed)?.checked_add(added)
}

/// `list_dir {path?}`: the entries of a directory, sorted, directories marked with `/`.
pub struct ListDir;

#[async_trait]
impl Tool for ListDir {
    fn name(&self) -> &str {
        "list_dir"
    }

    fn description(&self) -> &str {
        "List a directory of the workspace, sorted by name. Directories end with `/`, \
         symbolic links with `@`."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Directory path, relative to the workspace root. Default: the root."}
            },
            "additionalProperties": false
        })
    }

    /// Only reads the workspace.
    fn side_effect(&self, _args: &Value) -> SideEffect {
        SideEffect::Pure
    }

    fn paths(&self, args: &Value) -> Vec<String> {
        let p = path_arg(args, "path");
        if p.is_empty() { vec![".".into()] } else { p }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a = Args::parse(&args, &["path"])?;
        let path = a.opt_str("path")?.unwrap_or(".");
        let entries = ctx.workspace.list(path).await?;
        if entries.is_empty() {
            return Ok(ToolOutput::ok(format!("{path}: (empty directory)")));
        }
        let mut out = String::new();
        for e in entries.iter().take(LIST_MAX_ENTRIES) {
            out.push_str(&e.name);
            match e.kind {
                EntryKind::Dir => out.push('/'),
                EntryKind::Symlink => out.push('@'),
                EntryKind::File | EntryKind::Other => {}
            }
            out.push('\n');
        }
        if entries.len() > LIST_MAX_ENTRIES {
            out.push_str(&format!(
                "[{} more entries not shown]\n",
                entries.len() - LIST_MAX_ENTRIES
            ));
        }
        Ok(ToolOutput::ok(out))
    }
}

/// Compile a glob. `literal_separator` makes `*` stop at `/`, as in a shell.
fn compile_glob(
    field: &str,
    pattern: &str,
    literal_separator: bool,
) -> Result<GlobMatcher, ToolError> {
    GlobBuilder::new(pattern)
        .literal_separator(literal_separator)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| ToolError::InvalidArguments(format!("field `{field}`: invalid glob: {e}")))
}

/// `file` (relative to the workspace root) relative to the search base `base`, the string
/// patterns are matched against.
fn relative_to_base<'a>(file: &'a str, base: &str) -> &'a str {
    if base.is_empty() {
        return file;
    }
    file.strip_prefix(base)
        .and_then(|r| r.strip_prefix('/'))
        .unwrap_or(file)
}

/// The search base of `glob`/`grep` relative to the root with `/` separators ("" for the
/// root), so walk results can be matched relative to it.
fn base_of(ctx: &ToolContext, path: &str) -> Result<String, ToolError> {
    let rel = super::normalize_relative(ctx.workspace.root(), path)?;
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    Ok(parts.join("/"))
}

/// `glob {pattern, path?}`: files whose path matches a glob, sorted.
pub struct Glob;

#[async_trait]
impl Tool for Glob {
    fn name(&self) -> &str {
        "glob"
    }

    fn description(&self) -> &str {
        "Find files of the workspace by glob pattern, matched against the path relative to \
         `path` (default: the root). `*` does not cross `/`; use `**` for any depth, e.g. \
         `**/*.rs` or `src/**/mod.rs`. Skips .git, target and node_modules. Returns paths \
         relative to the workspace root, sorted."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Glob pattern, e.g. `**/*.rs`."},
                "path": {"type": "string", "description": "Directory to search in, relative to the workspace root. Default: the root."}
            },
            "required": ["pattern"],
            "additionalProperties": false
        })
    }

    /// Only reads the workspace.
    fn side_effect(&self, _args: &Value) -> SideEffect {
        SideEffect::Pure
    }

    fn paths(&self, args: &Value) -> Vec<String> {
        let p = path_arg(args, "path");
        if p.is_empty() { vec![".".into()] } else { p }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a = Args::parse(&args, &["pattern", "path"])?;
        let pattern = a.str("pattern")?;
        let path = a.opt_str("path")?.unwrap_or(".");
        let matcher = compile_glob(
            "pattern",
            pattern.strip_prefix("./").unwrap_or(pattern),
            true,
        )?;
        let base = base_of(ctx, path)?;
        let walk = ctx.workspace.walk(path, WALK_MAX_ENTRIES).await?;
        let matches: Vec<&String> = walk
            .files
            .iter()
            .filter(|f| matcher.is_match(relative_to_base(f, &base)))
            .collect();
        if matches.is_empty() {
            return Ok(ToolOutput::ok(format!(
                "no files match `{pattern}` under {path}{}",
                if walk.truncated {
                    " (search stopped early: too many entries)"
                } else {
                    ""
                }
            )));
        }
        let mut out = String::new();
        for f in matches.iter().take(GLOB_MAX_RESULTS) {
            out.push_str(f);
            out.push('\n');
        }
        if matches.len() > GLOB_MAX_RESULTS {
            out.push_str(&format!(
                "[{} more matches not shown; narrow the pattern]\n",
                matches.len() - GLOB_MAX_RESULTS
            ));
        }
        if walk.truncated {
            out.push_str("[search stopped early: too many entries; narrow `path`]\n");
        }
        Ok(ToolOutput::ok(out))
    }
}

/// `grep {pattern, path?, glob?, case_insensitive?}`: lines matching a regex, as
/// `path:line: text`.
pub struct Grep;

#[async_trait]
impl Tool for Grep {
    fn name(&self) -> &str {
        "grep"
    }

    fn description(&self) -> &str {
        "Search file contents of the workspace with a regular expression (Rust regex \
         syntax). Prints matching lines as `path:line: text`. `path` may be a directory or a \
         file. `glob` filters files: without `/` it matches the file name (`*.rs`), with `/` \
         the path relative to `path`. Skips binary files, .git, target and node_modules."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "pattern": {"type": "string", "description": "Regular expression to search for."},
                "path": {"type": "string", "description": "File or directory to search, relative to the workspace root. Default: the root."},
                "glob": {"type": "string", "description": "Only search files matching this glob, e.g. `*.rs` or `src/**/*.ts`."},
                "case_insensitive": {"type": "boolean", "description": "Ignore case. Default false."}
            },
            "required": ["pattern"],
            "additionalProperties": false
        })
    }

    /// Only reads the workspace.
    fn side_effect(&self, _args: &Value) -> SideEffect {
        SideEffect::Pure
    }

    fn paths(&self, args: &Value) -> Vec<String> {
        let p = path_arg(args, "path");
        if p.is_empty() { vec![".".into()] } else { p }
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let a = Args::parse(&args, &["pattern", "path", "glob", "case_insensitive"])?;
        let pattern = a.str("pattern")?;
        let path = a.opt_str("path")?.unwrap_or(".");
        let glob = a.opt_str("glob")?;
        let case_insensitive = a.opt_bool("case_insensitive")?.unwrap_or(false);
        let re = RegexBuilder::new(pattern)
            .case_insensitive(case_insensitive)
            .build()
            .map_err(|e| ToolError::InvalidArguments(format!("field `pattern`: {e}")))?;
        let filter = glob
            .map(|g| {
                Ok::<_, ToolError>((compile_glob("glob", g, g.contains('/'))?, g.contains('/')))
            })
            .transpose()?;
        let base = base_of(ctx, path)?;
        let walk = ctx.workspace.walk(path, WALK_MAX_ENTRIES).await?;

        let mut out = String::new();
        let mut matches = 0usize;
        let mut capped = false;
        let mut files_skipped = 0usize;
        'files: for file in &walk.files {
            if ctx.cancel.is_cancelled() {
                return Err(ToolError::Failed("cancelled".into()));
            }
            if let Some((m, by_path)) = &filter {
                let subject = if *by_path {
                    relative_to_base(file, &base)
                } else {
                    file.rsplit('/').next().unwrap_or(file)
                };
                if !m.is_match(subject) {
                    continue;
                }
            }
            // A file that cannot be read (a link leading outside, permissions) is skipped:
            // one bad file must not fail a whole search.
            let Ok(data) = ctx.workspace.read(file, ctx.settings.read_max_bytes).await else {
                files_skipped += 1;
                continue;
            };
            if is_binary(&data) {
                continue;
            }
            let text = String::from_utf8_lossy(&data);
            for (i, line) in text.lines().enumerate() {
                if re.is_match(line) {
                    if matches == GREP_MAX_MATCHES {
                        capped = true;
                        break 'files;
                    }
                    matches += 1;
                    out.push_str(&format!(
                        "{file}:{}: {}\n",
                        i + 1,
                        snippet(line.trim_end(), GREP_MAX_LINE_CHARS)
                    ));
                }
            }
        }
        if matches == 0 {
            out.push_str(&format!("no matches for `{pattern}` under {path}\n"));
        }
        if capped {
            out.push_str(&format!(
                "[stopped after {GREP_MAX_MATCHES} matches; narrow the pattern, path or glob]\n"
            ));
        }
        if files_skipped > 0 {
            out.push_str(&format!("[{files_skipped} unreadable files skipped]\n"));
        }
        if walk.truncated {
            out.push_str("[search stopped early: too many entries; narrow `path`]\n");
        }
        Ok(ToolOutput::ok(out))
    }
}
