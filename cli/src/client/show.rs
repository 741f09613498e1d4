//! How the client commands put things on a terminal: text cut to one line, pretty JSON,
//! ids quoted as shell words, tables, and the calls a session holds with the commands that
//! decide them.

use serde::Serialize;

/// Tool arguments are shown up to this many characters where a held call is listed.
const ARGS_CHARS: usize = 120;

/// Pretty JSON of an answer, keys sorted as the server sends them.
pub(crate) fn pretty(body: &impl Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(&serde_json::to_value(body)?)?)
}

/// `s` on one line, cut to `max` characters.
pub fn one_line(s: &str, max: usize) -> String {
    let flat = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        let cut: String = flat.chars().take(max).collect();
        format!("{cut}…")
    }
}

pub(crate) fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
        t.push('…');
        t
    }
}

/// `s` as one shell word. Call ids come from the model's provider, so anything but a
/// plain word is quoted, control characters escaped: the printed command is safe to paste.
pub fn shell_word(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_.:+=@%/,".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        return s.to_string();
    }
    if !s.chars().any(char::is_control) {
        return format!("'{}'", s.replace('\'', r"'\''"));
    }
    let mut out = String::from("$'");
    for c in s.chars() {
        match c {
            '\'' => out.push_str("\\'"),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// The commands that approve or deny a held call.
pub fn decide_commands(session_id: &str, call_id: &str) -> String {
    let (s, c) = (shell_word(session_id), shell_word(call_id));
    format!("agentq approve {s} {c}  |  agentq deny {s} {c} --reason '...'")
}

/// What `status` prints about the calls a session holds: none, or a header and two lines
/// per call (the call, then how to decide it).
pub fn pending_lines(session_id: &str, pending: &[agentq_api::PendingApproval]) -> Vec<String> {
    if pending.is_empty() {
        return Vec::new();
    }
    let deadline = pending
        .iter()
        .find_map(|p| p.deadline)
        .map(|d| format!(" (denied as `timeout` after {})", d.to_rfc3339()))
        .unwrap_or_default();
    let mut out = vec![format!(
        "{} tool call(s) await approval{deadline}:",
        pending.len()
    )];
    for p in pending {
        out.push(format!(
            "  {} {}({})",
            shell_word(&p.tool_call_id),
            p.tool,
            one_line(&p.arguments.to_string(), ARGS_CHARS)
        ));
        out.push(format!(
            "      {}",
            decide_commands(session_id, &p.tool_call_id)
        ));
    }
    out
}

/// `rows` under `header` in columns as wide as their widest cell (the last column as it
/// is), on stdout.
pub(crate) fn print_table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) {
    let mut widths = header.map(|h| h.chars().count());
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        println!("{}", out.trim_end());
    };
    line(header);
    for r in rows {
        line(&r.each_ref().map(String::as_str));
    }
}
