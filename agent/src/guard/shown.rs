//! What the guardian is shown of a call's arguments. A reviewer that sees a prefix of the
//! whole JSON can be blinded: keys are sorted, so a long `content` pushes `path` out of
//! sight (and `body` pushes `url`). Instead the view is built field by field:
//!
//! - every string whose member key (or an enclosing member's key) names a target — a
//!   path, URL, command, host… ([`is_target_key`]) — and every path the tool itself
//!   declares ([`crate::tools::Tool::paths`]) is shown in full, up to
//!   [`MAX_TARGET_BYTES`] each and [`MAX_TARGETS_BYTES`] in all;
//! - the other strings share [`MAX_ARGUMENTS_BYTES`]: the short ones are shown in full,
//!   and only the longest are cut, each to the same length, with its size stated;
//! - keys, list lengths and the number of values are bounded too.
//!
//! Whatever is not shown whole is listed in [`Shown::cut`] (a JSON pointer and what was
//! kept), so the reviewer is told, and the host can refuse such a call without asking.
//! A target cut for its size is "not seen whole" like anything else.

use serde::Serialize;
use serde_json::{Map, Value};

use super::hook::bounded;

/// The most of a call's non-target strings the reviewer is shown, in bytes, shared
/// among them.
pub const MAX_ARGUMENTS_BYTES: usize = 16 * 1024;
/// The longest target (path, URL, command, host…) shown whole.
pub const MAX_TARGET_BYTES: usize = 4 * 1024;
/// The most of all of a call's targets together.
pub const MAX_TARGETS_BYTES: usize = 16 * 1024;
/// The longest key shown whole.
const MAX_KEY_BYTES: usize = 256;
/// The most entries of one list or object shown.
const MAX_ITEMS: usize = 256;
/// The most values (at any depth) shown.
const MAX_NODES: usize = 4_096;
/// The most cut places listed; the rest are only counted.
const MAX_CUTS_LISTED: usize = 32;
/// The most targets listed (each is in the arguments as well).
const MAX_TARGETS_LISTED: usize = 64;
/// The longest JSON pointer given for a place (keys can nest deep).
const MAX_POINTER_BYTES: usize = 1024;
/// The arguments' view is replaced by a bounded prefix of its JSON past this (escapes and
/// structure can make the view longer than the strings it holds).
const MAX_VIEW_BYTES: usize = 4 * MAX_ARGUMENTS_BYTES;

/// Words that make a key name a target: what the call reads, writes, runs or reaches.
const TARGET_WORDS: &[&str] = &[
    "path",
    "paths",
    "file",
    "files",
    "filename",
    "filepath",
    "dir",
    "dirs",
    "directory",
    "folder",
    "cwd",
    "workdir",
    "glob",
    "url",
    "urls",
    "uri",
    "uris",
    "href",
    "link",
    "endpoint",
    "host",
    "hosts",
    "hostname",
    "domain",
    "server",
    "address",
    "addr",
    "ip",
    "port",
    "command",
    "commands",
    "cmd",
    "script",
    "exec",
    "program",
    "argv",
    "target",
    "targets",
    "dest",
    "destination",
    "src",
    "source",
    "repo",
    "repository",
    "remote",
    "bucket",
    "to",
    "cc",
    "bcc",
    "recipient",
    "recipients",
    "email",
];

/// Whether a member named `key` holds a target: one of its words (split at `_`, `-`,
/// other punctuation and lower-to-upper case changes, compared case-insensitively) is a
/// target word. `file_path`, `targetUrl`, `Host` and `cmd` are; `content`, `body` and
/// `description` are not.
pub fn is_target_key(key: &str) -> bool {
    let mut word = String::new();
    let mut prev_lower = false;
    let mut found = false;
    let mut end_word = |word: &mut String| {
        if !word.is_empty() && TARGET_WORDS.contains(&word.as_str()) {
            found = true;
        }
        word.clear();
    };
    for c in key.chars() {
        if !c.is_alphanumeric() {
            end_word(&mut word);
            prev_lower = false;
            continue;
        }
        if c.is_uppercase() && prev_lower {
            end_word(&mut word);
        }
        prev_lower = c.is_lowercase() || c.is_ascii_digit();
        word.extend(c.to_lowercase());
    }
    end_word(&mut word);
    found
}

/// One place of the arguments not shown whole.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cut {
    /// A JSON pointer into the arguments (`/content`, `/headers/Host`), or `paths()/N`
    /// for the tool's N-th declared path.
    pub at: String,
    /// `bytes` of a string, `items` of a list or object, `key_bytes` of a key.
    pub unit: &'static str,
    /// How many there are.
    pub of: usize,
    /// How many were shown.
    pub shown: usize,
    /// The place is a target.
    pub target: bool,
}

/// A target shown to the reviewer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Target {
    pub at: String,
    pub value: String,
}

/// The reviewer's view of one call.
#[derive(Debug, Clone, PartialEq)]
pub struct Shown {
    /// Every target found in the arguments, then the tool's declared paths.
    pub targets: Vec<Target>,
    /// The arguments with long strings cut.
    pub arguments: Value,
    /// What was not shown whole (the first [`MAX_CUTS_LISTED`]).
    pub cut: Vec<Cut>,
    /// Further places not shown whole, beyond those listed.
    pub more_cut: usize,
}

impl Shown {
    /// The view of `arguments`, with `declared` the paths the tool says the call touches.
    pub fn of(arguments: &Value, declared: &[String]) -> Shown {
        let mut nodes = 0usize;
        let tree = build(arguments, false, &mut nodes);
        let mut lengths = Vec::new();
        tree.plain_lengths(&mut lengths);
        let mut view = View {
            cap: fair_share(lengths, MAX_ARGUMENTS_BYTES),
            targets_left: MAX_TARGETS_BYTES,
            shown: Shown {
                targets: Vec::new(),
                arguments: Value::Null,
                cut: Vec::new(),
                more_cut: 0,
            },
        };
        let mut at = String::new();
        view.shown.arguments = view.render(&tree, &mut at);
        let json_len = view.shown.arguments.to_string().len();
        if json_len > MAX_VIEW_BYTES {
            let text = view.shown.arguments.to_string();
            let kept = bounded(&text, MAX_ARGUMENTS_BYTES).to_string();
            view.note(Cut {
                at: String::new(),
                unit: "bytes",
                of: json_len,
                shown: kept.len(),
                target: false,
            });
            view.shown.arguments = Value::String(kept);
        }
        for (i, p) in declared.iter().enumerate() {
            view.target(p, &format!("paths()/{i}"));
        }
        view.shown
    }

    /// Everything was shown whole.
    pub fn whole(&self) -> bool {
        self.cut.is_empty() && self.more_cut == 0
    }

    /// What was not shown whole, for a message: `/content (18432 bytes, 16384 shown)`.
    pub fn describe_cut(&self) -> String {
        let mut parts: Vec<String> = self
            .cut
            .iter()
            .take(4)
            .map(|c| {
                let at = if c.at.is_empty() {
                    "the arguments"
                } else {
                    &c.at
                };
                format!("{at} ({} {}, {} shown)", c.of, c.unit, c.shown)
            })
            .collect();
        let rest = self
            .cut
            .len()
            .saturating_sub(4)
            .saturating_add(self.more_cut);
        if rest > 0 {
            parts.push(format!("{rest} more"));
        }
        parts.join(", ")
    }
}

/// The arguments as walked: within the bounds on values and entries.
enum Node<'a> {
    Str {
        s: &'a str,
        target: bool,
    },
    Scalar(&'a Value),
    List {
        items: Vec<Node<'a>>,
        of: usize,
    },
    Map {
        members: Vec<(&'a str, Node<'a>)>,
        of: usize,
    },
}

fn build<'a>(v: &'a Value, target: bool, nodes: &mut usize) -> Node<'a> {
    *nodes = nodes.saturating_add(1);
    match v {
        Value::String(s) => Node::Str { s, target },
        Value::Array(items) => {
            let mut shown = Vec::new();
            for item in items.iter().take(MAX_ITEMS) {
                if *nodes >= MAX_NODES {
                    break;
                }
                shown.push(build(item, target, nodes));
            }
            Node::List {
                items: shown,
                of: items.len(),
            }
        }
        Value::Object(map) => {
            let mut shown = Vec::new();
            for (k, item) in map.iter().take(MAX_ITEMS) {
                if *nodes >= MAX_NODES {
                    break;
                }
                let t = target || is_target_key(k);
                shown.push((k.as_str(), build(item, t, nodes)));
            }
            Node::Map {
                members: shown,
                of: map.len(),
            }
        }
        other => Node::Scalar(other),
    }
}

impl Node<'_> {
    /// The lengths of the strings that share [`MAX_ARGUMENTS_BYTES`] (not targets).
    fn plain_lengths(&self, out: &mut Vec<usize>) {
        match self {
            Node::Str { s, target: false } => out.push(s.len()),
            Node::Str { .. } | Node::Scalar(_) => {}
            Node::List { items, .. } => items.iter().for_each(|n| n.plain_lengths(out)),
            Node::Map { members, .. } => members.iter().for_each(|(_, n)| n.plain_lengths(out)),
        }
    }
}

/// The largest length `c` such that showing `min(len, c)` of every string fits in
/// `budget`: strings no longer than `c` are shown whole. `usize::MAX` when all fit.
fn fair_share(mut lengths: Vec<usize>, budget: usize) -> usize {
    lengths.sort_unstable();
    let mut left = budget;
    let n = lengths.len();
    for (i, len) in lengths.iter().enumerate() {
        let share = left / (n - i);
        if *len > share {
            return share;
        }
        left -= len;
    }
    usize::MAX
}

/// Rendering state: the share of plain strings, what is left for targets, the view.
struct View {
    cap: usize,
    targets_left: usize,
    shown: Shown,
}

impl View {
    fn note(&mut self, mut cut: Cut) {
        if self.shown.cut.len() < MAX_CUTS_LISTED {
            cut.at = bounded(&cut.at, MAX_POINTER_BYTES).to_string();
            self.shown.cut.push(cut);
        } else {
            self.shown.more_cut = self.shown.more_cut.saturating_add(1);
        }
    }

    /// A target's shown part, listed in the targets: whole when it fits its own bound and
    /// what is left of all. One that could not be listed counts as cut.
    fn target<'s>(&mut self, s: &'s str, at: &str) -> &'s str {
        let room = MAX_TARGET_BYTES.min(self.targets_left);
        let kept = bounded(s, room);
        self.targets_left = self.targets_left.saturating_sub(kept.len());
        // An empty string is listed; one with nothing left to show of it is only cut.
        let listed =
            self.shown.targets.len() < MAX_TARGETS_LISTED && (!kept.is_empty() || s.is_empty());
        if kept.len() < s.len() || !listed {
            self.note(Cut {
                at: at.to_string(),
                unit: "bytes",
                of: s.len(),
                shown: if listed { kept.len() } else { 0 },
                target: true,
            });
        }
        if listed {
            self.shown.targets.push(Target {
                at: bounded(at, MAX_POINTER_BYTES).to_string(),
                value: kept.to_string(),
            });
        }
        kept
    }

    fn render(&mut self, node: &Node<'_>, at: &mut String) -> Value {
        match node {
            Node::Scalar(v) => (*v).clone(),
            Node::Str { s, target: true } => Value::String(self.target(s, at).to_string()),
            Node::Str { s, target: false } => {
                let kept = bounded(s, self.cap);
                if kept.len() < s.len() {
                    self.note(Cut {
                        at: at.clone(),
                        unit: "bytes",
                        of: s.len(),
                        shown: kept.len(),
                        target: false,
                    });
                }
                Value::String(kept.to_string())
            }
            Node::List { items, of } => {
                let mut out = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let len = at.len();
                    at.push('/');
                    at.push_str(&i.to_string());
                    out.push(self.render(item, at));
                    at.truncate(len);
                }
                self.note_items(at, *of, items.len(), node_is_target(items.first()));
                Value::Array(out)
            }
            Node::Map { members, of } => {
                let mut out = Map::new();
                for (i, (key, item)) in members.iter().enumerate() {
                    let shown_key = if key.len() > MAX_KEY_BYTES {
                        // Cut keys get their position so two with one prefix stay apart.
                        format!("{}…#{i}", bounded(key, MAX_KEY_BYTES))
                    } else {
                        (*key).to_string()
                    };
                    let len = at.len();
                    at.push('/');
                    at.push_str(&pointer_token(&shown_key));
                    if shown_key != *key {
                        self.note(Cut {
                            at: at.clone(),
                            unit: "key_bytes",
                            of: key.len(),
                            shown: MAX_KEY_BYTES.min(key.len()),
                            target: false,
                        });
                    }
                    let v = self.render(item, at);
                    at.truncate(len);
                    out.insert(shown_key, v);
                }
                self.note_items(at, *of, members.len(), false);
                Value::Object(out)
            }
        }
    }

    fn note_items(&mut self, at: &str, of: usize, shown: usize, target: bool) {
        if shown < of {
            self.note(Cut {
                at: at.to_string(),
                unit: "items",
                of,
                shown,
                target,
            });
        }
    }
}

fn node_is_target(n: Option<&Node<'_>>) -> bool {
    matches!(n, Some(Node::Str { target: true, .. }))
}

/// `key` as a JSON pointer token (`~` and `/` escaped).
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn target_keys_by_their_words() {
        for k in [
            "path",
            "file_path",
            "targetUrl",
            "Host",
            "cmd",
            "paths",
            "working-dir",
            "URL",
            "dest_path",
        ] {
            assert!(is_target_key(k), "{k}");
        }
        for k in [
            "content",
            "body",
            "description",
            "profile",
            "old_string",
            "pattern",
            "method",
            "headers",
            "",
        ] {
            assert!(!is_target_key(k), "{k}");
        }
    }

    #[test]
    fn short_fields_whole_and_long_ones_cut_alike() {
        let args = json!({
            "a": "x".repeat(100),
            "b": "y".repeat(20_000),
            "c": "z".repeat(30_000),
        });
        let s = Shown::of(&args, &[]);
        assert_eq!(s.arguments["a"].as_str().unwrap().len(), 100);
        let share = (MAX_ARGUMENTS_BYTES - 100) / 2;
        assert_eq!(s.arguments["b"].as_str().unwrap().len(), share);
        assert_eq!(s.arguments["c"].as_str().unwrap().len(), share);
        assert!(!s.whole());
        let ats: Vec<&str> = s.cut.iter().map(|c| c.at.as_str()).collect();
        assert_eq!(ats, ["/b", "/c"]);
        assert_eq!(s.cut[0].of, 20_000);
        assert_eq!(s.cut[0].shown, share);
    }

    #[test]
    fn everything_that_fits_is_whole() {
        let args = json!({"path": "src/a.rs", "content": "y".repeat(MAX_ARGUMENTS_BYTES)});
        let s = Shown::of(&args, &["src/a.rs".into()]);
        assert!(s.whole(), "{:?}", s.cut);
        assert_eq!(s.arguments, args);
        assert_eq!(
            s.targets,
            [
                Target {
                    at: "/path".into(),
                    value: "src/a.rs".into()
                },
                Target {
                    at: "paths()/0".into(),
                    value: "src/a.rs".into()
                }
            ]
        );
    }

    #[test]
    fn a_target_too_long_is_not_seen_whole() {
        let long = "d/".repeat(MAX_TARGET_BYTES);
        let s = Shown::of(&json!({"path": long}), &[]);
        assert!(!s.whole());
        assert_eq!(s.cut.len(), 1);
        assert!(s.cut[0].target);
        assert_eq!(s.targets[0].value.len(), MAX_TARGET_BYTES);
    }

    #[test]
    fn nested_targets_and_lists_and_keys() {
        let args = json!({
            "headers": {"Host": "evil.example", "X": "1"},
            "paths": ["a", "b"],
            "k".repeat(300): 1,
            "many": (0..300).collect::<Vec<_>>(),
        });
        let s = Shown::of(&args, &[]);
        let targets: Vec<(&str, &str)> = s
            .targets
            .iter()
            .map(|t| (t.at.as_str(), t.value.as_str()))
            .collect();
        assert_eq!(
            targets,
            [
                ("/headers/Host", "evil.example"),
                ("/paths/0", "a"),
                ("/paths/1", "b")
            ]
        );
        let units: Vec<&str> = s.cut.iter().map(|c| c.unit).collect();
        assert_eq!(units, ["key_bytes", "items"], "{:?}", s.cut);
        assert_eq!(s.arguments["many"].as_array().unwrap().len(), MAX_ITEMS);
    }

    #[test]
    fn targets_past_their_room_are_cut_not_listed_empty() {
        let many: Vec<String> = (0..100)
            .map(|i| format!("{i}/{}", "p".repeat(500)))
            .collect();
        let s = Shown::of(&json!({ "paths": many }), &[]);
        assert!(!s.whole());
        assert!(s.targets.len() <= MAX_TARGETS_LISTED);
        assert!(s.targets.iter().all(|t| !t.value.is_empty()));
        let listed: usize = s.targets.iter().map(|t| t.value.len()).sum();
        assert!(listed <= MAX_TARGETS_BYTES);
        assert!(s.cut.iter().all(|c| c.target));
    }

    #[test]
    fn fair_share_fills_the_budget() {
        assert_eq!(fair_share(vec![], 10), usize::MAX);
        assert_eq!(fair_share(vec![3, 3], 10), usize::MAX);
        assert_eq!(fair_share(vec![2, 20, 30], 10), 4);
        assert_eq!(fair_share(vec![100], 10), 10);
    }
}
