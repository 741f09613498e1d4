//! The hostile sessions of the isolation part: each kind's session spec and what its model
//! answers. The model is the fake OpenAI endpoint, which tells a hostile session from a
//! bystander by a marker in its prompt and answers it with the attack, so that every
//! hostile byte goes through the real provider's stream parsing, the tools and the
//! stores as a malicious model's would.

use agentq_agent::spec::{DEFAULT_MAX_ITERATIONS, SessionSpec};
use agentq_fixtures::FakeResponse;
use serde_json::json;

use crate::llm::{answer_calling, assistant_turns, call_chunk, chunk, finish};
use crate::turns::{FINAL_TEXT, PROMPT, TURN_TEXT, spec};

/// What a hostile session does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// Answers text with NUL characters in it, every turn (Postgres cannot store a NUL in
    /// `text` or `jsonb`).
    Nul,
    /// `write_file` 16 KiB of `a`, then `edit_file` replacing every `a` by 1 000 of them,
    /// twice: 16 GB if the edit is not bounded before it allocates.
    EditBomb,
    /// `write_file` with `--hostile-bytes` of content, `read_file` of it, then a final
    /// answer that long, each streamed in pieces.
    BigOutput,
    /// Calls a tool every turn and never answers, until the iteration limit stops it.
    Spin,
    /// A `timeout_secs` too large for any clock (its deadline overflows).
    HugeTimeout,
}

/// Every kind, in the order of `--hostile`'s help.
pub const ALL: &[Kind] = &[
    Kind::Nul,
    Kind::EditBomb,
    Kind::BigOutput,
    Kind::Spin,
    Kind::HugeTimeout,
];

/// The names `--hostile` takes.
pub const NAMES: &[&str] = &["nul", "edit_bomb", "big_output", "spin", "huge_timeout"];

/// How a hostile prompt names its kind to the fake model.
const MARKER: &str = "bench-hostile=";
/// The edit bomb's file, and each edit's expansion.
const BOMB_BYTES: usize = 16 * 1024;
const BOMB_FACTOR: usize = 1000;
/// The huge timeout: about 285 million years, past what `Instant` and `chrono` can add.
const HUGE_TIMEOUT_SECS: u64 = 9_000_000_000_000_000;
/// Large contents are streamed in deltas of this size, as a model streams them.
const DELTA_BYTES: usize = 64 * 1024;
/// The tools a hostile session is given besides the bystanders' one.
const HOSTILE_TOOLS: &[&str] = &["read_file", "write_file", "edit_file"];

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Nul => "nul",
            Kind::EditBomb => "edit_bomb",
            Kind::BigOutput => "big_output",
            Kind::Spin => "spin",
            Kind::HugeTimeout => "huge_timeout",
        }
    }

    pub fn parse(name: &str) -> Option<Kind> {
        ALL.iter().copied().find(|k| k.name() == name)
    }

    /// The session: a bystander's spec of `iterations`, its prompt marked with the kind,
    /// and the kind's own settings.
    pub fn spec(self, iterations: u32, tool: &str) -> SessionSpec {
        let mut s = spec(iterations, tool);
        s.prompt = format!("{PROMPT} [{MARKER}{}]", self.name());
        s.tools = Some(tools(tool));
        match self {
            // The limit an operator's default gives, well past the bystanders' length.
            Kind::Spin => s.max_iterations = DEFAULT_MAX_ITERATIONS.max(iterations + 5),
            Kind::HugeTimeout => s.timeout_secs = Some(HUGE_TIMEOUT_SECS),
            Kind::Nul | Kind::EditBomb | Kind::BigOutput => {}
        }
        s
    }
}

/// The kinds `--hostile` names (every kind when it names none), each once, in the order
/// of [`ALL`].
pub fn selected(names: &[String]) -> anyhow::Result<Vec<Kind>> {
    let mut out = Vec::new();
    for n in names {
        let n = n.trim();
        if n.is_empty() {
            continue;
        }
        let k = Kind::parse(n).ok_or_else(|| {
            anyhow::anyhow!(
                "--hostile: unknown kind {n:?} (kinds: {})",
                NAMES.join(", ")
            )
        })?;
        if !out.contains(&k) {
            out.push(k);
        }
    }
    if out.is_empty() {
        out = ALL.to_vec();
    }
    out.sort();
    Ok(out)
}

/// Hostile sessions beside `bystanders` so that they are `percent` of all sessions (at
/// least one).
pub fn count(bystanders: u32, percent: u32) -> u32 {
    let percent = u64::from(percent.min(99));
    let n = (u64::from(bystanders) * percent).div_ceil(100 - percent);
    u32::try_from(n.max(1)).unwrap_or(u32::MAX)
}

/// Every tool a session of the part may call: the bystanders' one and the hostile ones.
pub fn tools(tool: &str) -> Vec<String> {
    let mut all = vec![tool.to_string()];
    all.extend(HOSTILE_TOOLS.iter().map(|t| t.to_string()));
    all
}

/// The kind a request's prompt names, if any.
fn kind_of(body: &[u8]) -> Option<Kind> {
    let at = body
        .windows(MARKER.len())
        .position(|w| w == MARKER.as_bytes())?;
    let rest = body.get(at + MARKER.len()..)?;
    let end = rest
        .iter()
        .position(|b| !(b.is_ascii_lowercase() || *b == b'_'))
        .unwrap_or(rest.len());
    Kind::parse(std::str::from_utf8(rest.get(..end)?).ok()?)
}

/// The fake model of the isolation part: a bystander's answer ([`answer_calling`], turns
/// calling `tool`, `iterations` in all), or a hostile kind's. `bytes` is the size of the
/// big outputs.
pub fn answer(body: &[u8], iterations: u32, tool: &str, bytes: usize) -> FakeResponse {
    let Some(kind) = kind_of(body) else {
        return answer_calling(body, iterations, tool);
    };
    let turn = assistant_turns(body);
    let call = |name: &str, args: serde_json::Value| {
        let mut out = text_chunk(TURN_TEXT);
        out.push_str(&call_chunk(turn, name, &args));
        out.push_str(&chunk(json!({}), Some("tool_calls")));
        finish(out)
    };
    let last = |text: &str| {
        let mut out = text_chunk(text);
        out.push_str(&chunk(json!({}), Some("stop")));
        finish(out)
    };
    match kind {
        Kind::Nul => {
            if turn + 1 >= iterations as usize {
                last(&format!("{FINAL_TEXT}\u{0} and\u{0}\u{0}done"))
            } else {
                let mut out = text_chunk(&format!("I will\u{0} look\u{0}: {TURN_TEXT}"));
                out.push_str(&call_chunk(turn, tool, &json!({"path": "."})));
                out.push_str(&chunk(json!({}), Some("tool_calls")));
                finish(out)
            }
        }
        Kind::EditBomb => match turn {
            0 => call(
                "write_file",
                json!({"path": "bomb.txt", "content": "a".repeat(BOMB_BYTES)}),
            ),
            1 | 2 => call(
                "edit_file",
                json!({
                    "path": "bomb.txt",
                    "old_string": "a",
                    "new_string": "a".repeat(BOMB_FACTOR),
                    "replace_all": true,
                }),
            ),
            _ => last(FINAL_TEXT),
        },
        Kind::BigOutput => match turn {
            0 => {
                let mut out = text_chunk(TURN_TEXT);
                out.push_str(&big_write_call(turn, bytes));
                out.push_str(&chunk(json!({}), Some("tool_calls")));
                finish(out)
            }
            1 => call("read_file", json!({"path": "big.txt"})),
            _ => {
                let mut out = String::with_capacity(bytes.saturating_add(bytes / 4));
                for piece in pieces(bytes, 'b') {
                    out.push_str(&chunk(json!({"content": piece}), None));
                }
                out.push_str(&chunk(json!({}), Some("stop")));
                finish(out)
            }
        },
        Kind::Spin => call(tool, json!({"path": "."})),
        Kind::HugeTimeout => answer_calling(body, iterations, tool),
    }
}

fn text_chunk(text: &str) -> String {
    chunk(json!({"role": "assistant", "content": text}), None)
}

/// A `write_file` call of `bytes` of content whose arguments arrive in pieces, as a model
/// streams a long argument.
fn big_write_call(turn: usize, bytes: usize) -> String {
    let fragment = |index_only: bool, text: &str| {
        let function = if index_only {
            json!({"arguments": text})
        } else {
            json!({"name": "write_file", "arguments": text})
        };
        let mut call = json!({"index": 0, "function": function});
        if !index_only {
            call["id"] = json!(format!("call_{turn}"));
            call["type"] = json!("function");
        }
        chunk(json!({"tool_calls": [call]}), None)
    };
    let mut out = String::with_capacity(bytes.saturating_add(bytes / 4));
    out.push_str(&fragment(false, r#"{"path":"big.txt","content":""#));
    for piece in pieces(bytes, 'a') {
        out.push_str(&fragment(true, &piece));
    }
    out.push_str(&fragment(true, r#""}"#));
    out
}

/// `bytes` of `c` in deltas of at most [`DELTA_BYTES`].
fn pieces(bytes: usize, c: char) -> impl Iterator<Item = String> {
    let full = bytes / DELTA_BYTES;
    let rest = bytes % DELTA_BYTES;
    (0..full)
        .map(move |_| c.to_string().repeat(DELTA_BYTES))
        .chain((rest > 0).then(|| c.to_string().repeat(rest)))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// A request body as the OpenAI provider sends it: the prompt, then `turns`
    /// assistant turns.
    fn body(prompt: &str, turns: usize) -> Vec<u8> {
        let mut messages = vec![json!({"role": "user", "content": prompt})];
        for _ in 0..turns {
            messages.push(json!({"role": "assistant", "content": "x"}));
        }
        serde_json::to_vec(&json!({"model": "m", "messages": messages})).unwrap()
    }

    fn text(r: FakeResponse) -> String {
        String::from_utf8(r.chunks[0].1.to_vec()).unwrap()
    }

    fn prompt(kind: Kind) -> String {
        kind.spec(3, "trivial").prompt
    }

    #[test]
    fn every_name_parses_to_its_kind() {
        assert_eq!(NAMES.len(), ALL.len());
        for (n, k) in NAMES.iter().zip(ALL) {
            assert_eq!(Kind::parse(n), Some(*k));
            assert_eq!(kind_of(&body(&prompt(*k), 0)), Some(*k));
        }
        assert_eq!(kind_of(&body(PROMPT, 0)), None);
        let all = selected(&[]).unwrap();
        assert_eq!(all, ALL);
        let two = selected(&["spin".into(), " nul".into(), "spin".into()]).unwrap();
        assert_eq!(two, [Kind::Nul, Kind::Spin]);
        let e = selected(&["bomb".into()]).unwrap_err().to_string();
        assert!(e.contains("--hostile") && e.contains("edit_bomb"), "{e}");
    }

    #[test]
    fn ten_percent_of_all_sessions_are_hostile() {
        assert_eq!(count(450, 10), 50);
        assert_eq!(count(500, 10), 56);
        assert_eq!(count(1, 10), 1);
        assert_eq!(count(9, 50), 9);
    }

    #[test]
    fn bystanders_get_the_ordinary_answer() {
        let t = text(answer(&body(PROMPT, 0), 3, "trivial", 10));
        assert!(t.contains("\"trivial\"") && !t.contains("\\u0000"), "{t}");
    }

    #[test]
    fn nul_answers_carry_nul_characters_every_turn() {
        for turn in 0..3 {
            let t = text(answer(&body(&prompt(Kind::Nul), turn), 3, "trivial", 10));
            assert!(t.contains("\\u0000"), "turn {turn}: {t}");
        }
    }

    #[test]
    fn the_edit_bomb_writes_then_expands_twice_then_answers() {
        let p = prompt(Kind::EditBomb);
        let turn = |n| text(answer(&body(&p, n), 3, "trivial", 10));
        assert!(turn(0).contains("write_file"));
        assert!(turn(1).contains("edit_file") && turn(1).contains("replace_all"));
        assert!(turn(2).contains("edit_file"));
        assert!(turn(3).contains(FINAL_TEXT));
    }

    #[test]
    fn big_output_streams_its_bytes_in_pieces() {
        let p = prompt(Kind::BigOutput);
        let bytes = 3 * DELTA_BYTES + 5;
        let write = text(answer(&body(&p, 0), 3, "trivial", bytes));
        assert!(write.matches('a').count() >= bytes);
        // The arguments, reassembled, are the call the model means.
        let mut args = String::new();
        for line in write.lines().filter_map(|l| l.strip_prefix("data: ")) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if let Some(a) =
                v["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str()
            {
                args.push_str(a);
            }
        }
        let args: serde_json::Value = serde_json::from_str(&args).unwrap();
        assert_eq!(args["path"], "big.txt");
        assert_eq!(args["content"].as_str().unwrap().len(), bytes);
        assert!(text(answer(&body(&p, 1), 3, "trivial", bytes)).contains("read_file"));
        let last = text(answer(&body(&p, 2), 3, "trivial", bytes));
        assert!(last.matches('b').count() >= bytes);
        assert!(last.contains("\"stop\""));
    }

    #[test]
    fn spin_never_answers() {
        let p = prompt(Kind::Spin);
        for turn in [0, 2, 10, 100] {
            let t = text(answer(&body(&p, turn), 3, "trivial", 10));
            assert!(t.contains("tool_calls\":["), "turn {turn}: {t}");
        }
        assert!(Kind::Spin.spec(3, "trivial").max_iterations >= DEFAULT_MAX_ITERATIONS);
    }

    #[test]
    fn huge_timeout_is_a_bystander_with_an_overflowing_deadline() {
        let s = Kind::HugeTimeout.spec(3, "trivial");
        assert_eq!(s.timeout_secs, Some(HUGE_TIMEOUT_SECS));
        let t = text(answer(
            &body(&prompt(Kind::HugeTimeout), 2),
            3,
            "trivial",
            10,
        ));
        assert!(t.contains(FINAL_TEXT), "{t}");
    }
}
