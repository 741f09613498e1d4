//! Reasoning models that stream their thinking inline, between `<think>` tags, in the
//! answer text: splitting it out, whatever the chunking.

/// Splits `<think>…</think>` out of streamed text, whatever the chunking. Text that could
/// be the start of a tag is held back until the next chunk decides it.
#[derive(Debug, Default)]
pub struct ThinkSplitter {
    in_think: bool,
    pending: String,
}

/// A piece of streamed text, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Thinking(String),
}

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

impl ThinkSplitter {
    pub fn push(&mut self, chunk: &str) -> Vec<Piece> {
        self.pending.push_str(chunk);
        let mut out = Vec::new();
        loop {
            let tag = if self.in_think { CLOSE } else { OPEN };
            if let Some(pos) = self.pending.find(tag) {
                let before: String = self.pending[..pos].to_string();
                self.emit(&mut out, before);
                self.pending.drain(..pos + tag.len());
                self.in_think = !self.in_think;
                continue;
            }
            // Keep back a suffix that could begin the tag.
            let keep = (1..tag.len())
                .rev()
                .find(|&k| self.pending.len() >= k && self.pending.ends_with(&tag[..k]))
                .unwrap_or(0);
            let emit_to = self.pending.len() - keep;
            let text: String = self.pending[..emit_to].to_string();
            self.pending.drain(..emit_to);
            self.emit(&mut out, text);
            break;
        }
        out
    }

    pub fn finish(&mut self) -> Vec<Piece> {
        let rest = std::mem::take(&mut self.pending);
        let mut out = Vec::new();
        self.emit(&mut out, rest);
        out
    }

    fn emit(&self, out: &mut Vec<Piece>, s: String) {
        if s.is_empty() {
            return;
        }
        out.push(if self.in_think {
            Piece::Thinking(s)
        } else {
            Piece::Text(s)
        });
    }
}

/// Remove `<think>` blocks from a complete text (for stored answers).
pub fn strip_think(text: &str) -> (String, String) {
    let mut s = ThinkSplitter::default();
    let mut pieces = s.push(text);
    pieces.extend(s.finish());
    let (mut t, mut th) = (String::new(), String::new());
    for p in pieces {
        match p {
            Piece::Text(x) => t.push_str(&x),
            Piece::Thinking(x) => th.push_str(&x),
        }
    }
    (t, th)
}
