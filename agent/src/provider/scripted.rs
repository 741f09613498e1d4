//! The scripted provider: a JSON script of turns (text, thinking, tool calls, failures,
//! delays) played back through the same streaming interface as a real model. Used by
//! tests, `agentq run --provider scripted` and the demo.
//!
//! The turn to play is chosen from the request — the number of assistant messages already
//! in the history — not from a counter, so a session resumed on another worker continues
//! with the right turn.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::provider::{LlmEvent, LlmProvider, LlmRequest, LlmStream, RateLimitInfo};
use crate::schema::{FinishReason, Role, Usage};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Script {
    pub turns: Vec<Turn>,
    /// Past the end of the script, replay the last turn forever (for limit tests).
    #[serde(default)]
    pub repeat_last: bool,
    /// Other scripts for sessions whose task (first user message) contains a marker: one
    /// provider can play a parent and its sub-agents differently.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub variants: Vec<Variant>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Variant {
    pub when_prompt_contains: String,
    pub turns: Vec<Turn>,
    #[serde(default)]
    pub repeat_last: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScriptedCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Value,
    /// Send these exact argument bytes instead of `arguments` (e.g. invalid JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_arguments: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

/// A failure to produce before the turn succeeds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScriptedFailure {
    /// HTTP status to fail with; 0 means a transport error.
    #[serde(default)]
    pub status: u16,
    #[serde(default)]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// Instead of an error, answer with an `error` finish and no content.
    #[serde(default)]
    pub empty_error_finish: bool,
    /// The rate-limit state the failure announces (as a provider's headers would).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RateLimitInfo>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// The answer text. `{{prompt}}` and `{{last_tool_result}}` are substituted.
    #[serde(default)]
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ScriptedCall>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// Delay before the first event.
    #[serde(default)]
    pub delay_ms: u64,
    /// Delay between text chunks.
    #[serde(default)]
    pub chunk_delay_ms: u64,
    /// Text is streamed in chunks of this many characters (0: one chunk).
    #[serde(default)]
    pub chunk_chars: usize,
    /// Failures to produce, one per attempt, before this turn is answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fail: Vec<ScriptedFailure>,
    /// The rate-limit state the answer announces (sent first, as a provider's headers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RateLimitInfo>,
}

/// Attempts per (session, turn), to play each turn's failures once.
type Attempts = Mutex<HashMap<(String, usize), usize>>;

/// The attempt counts of the providers [`ScriptedProvider::shared`] built, by script text.
static SHARED_ATTEMPTS: LazyLock<Mutex<HashMap<String, Weak<Attempts>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

pub struct ScriptedProvider {
    script: Script,
    attempts: Arc<Attempts>,
}

impl ScriptedProvider {
    pub fn new(script: Script) -> Self {
        ScriptedProvider {
            script,
            attempts: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    pub fn from_json(json: &str) -> Result<Self> {
        let script: Script = serde_json::from_str(json)
            .map_err(|e| Error::Config(format!("invalid script: {e}")))?;
        Ok(Self::new(script))
    }

    /// As [`ScriptedProvider::from_json`], counting attempts together with every other
    /// provider of this process built here from the same script (while one lives). Each
    /// worker builds its own provider, and a process may run several workers (`agentq dev`
    /// runs four): a session retried after a scripted failure may land on another one,
    /// which must play the turn's next attempt, not its first failure again, as one model
    /// server answers a session the same whichever worker calls it.
    pub fn shared(json: &str) -> Result<Self> {
        let mut p = Self::from_json(json)?;
        let mut all = SHARED_ATTEMPTS.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|_, w| w.strong_count() > 0);
        match all.get(json).and_then(Weak::upgrade) {
            Some(attempts) => p.attempts = attempts,
            None => {
                all.insert(json.to_string(), Arc::downgrade(&p.attempts));
            }
        }
        Ok(p)
    }

    /// A built-in script: look at the workspace, then answer with what was seen.
    pub fn demo() -> Self {
        Self::new(Script {
            turns: vec![
                Turn {
                    text: "Let me look at the workspace first.".into(),
                    tool_calls: vec![ScriptedCall {
                        name: "list_dir".into(),
                        arguments: serde_json::json!({"path": "."}),
                        ..Default::default()
                    }],
                    usage: Some(Usage {
                        input_tokens: 120,
                        output_tokens: 18,
                        ..Default::default()
                    }),
                    chunk_chars: 6,
                    ..Default::default()
                },
                Turn {
                    text:
                        "You asked: \"{{prompt}}\". The workspace contains:\n{{last_tool_result}}"
                            .into(),
                    usage: Some(Usage {
                        input_tokens: 180,
                        output_tokens: 40,
                        ..Default::default()
                    }),
                    chunk_chars: 6,
                    ..Default::default()
                },
            ],
            repeat_last: false,
            variants: Vec::new(),
        })
    }
}

fn substitute(text: &str, req: &LlmRequest<'_>) -> String {
    if !text.contains("{{") {
        return text.to_string();
    }
    let prompt = req
        .messages
        .iter()
        .find(|m| m.role == Role::User)
        .map(|m| m.content.as_str())
        .unwrap_or("");
    let last_tool = req
        .messages
        .iter()
        .rev()
        .find(|m| m.role == Role::Tool)
        .map(|m| m.content.as_str())
        .unwrap_or("");
    text.replace("{{prompt}}", prompt)
        .replace("{{last_tool_result}}", last_tool)
}

fn chunks(text: &str, size: usize) -> Vec<String> {
    if size == 0 || text.is_empty() {
        return if text.is_empty() {
            Vec::new()
        } else {
            vec![text.to_string()]
        };
    }
    let chars: Vec<char> = text.chars().collect();
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

impl ScriptedProvider {
    /// The turn the request is at (the number of assistant messages in its history) and
    /// what to play for it: from the variant whose marker the task contains, else the
    /// main script.
    fn turn_for(&self, request: &LlmRequest<'_>) -> (usize, Turn) {
        let index = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let task = request
            .messages
            .iter()
            .find(|m| m.role == Role::User)
            .map(|m| m.content.as_str())
            .unwrap_or("");
        let (turns, repeat_last) = self
            .script
            .variants
            .iter()
            .find(|v| task.contains(&v.when_prompt_contains))
            .map_or((&self.script.turns, self.script.repeat_last), |v| {
                (&v.turns, v.repeat_last)
            });
        let turn = match turns.get(index) {
            Some(t) => t.clone(),
            None if repeat_last && !turns.is_empty() => turns[turns.len() - 1].clone(),
            None => Turn {
                text: "(the script has no more turns)".into(),
                ..Default::default()
            },
        };
        (index, turn)
    }

    /// How many times turn `index` of this session was asked for before (0 the first
    /// time): which of its scripted failures, if any, this try plays.
    fn attempt(&self, session_id: &str, index: usize) -> usize {
        let mut a = self.attempts.lock().unwrap_or_else(|e| e.into_inner());
        let n = a.entry((session_id.to_string(), index)).or_insert(0);
        *n += 1;
        *n - 1
    }
}

/// A scripted failure as the provider reports it: an error, or an answer that finishes
/// with `error` and nothing else.
fn failure(f: &ScriptedFailure) -> Result<LlmStream> {
    if f.empty_error_finish {
        let evs: Vec<Result<LlmEvent>> = vec![Ok(LlmEvent::Done(FinishReason::Error))];
        return Ok(Box::pin(futures::stream::iter(evs)));
    }
    if f.status == 0 {
        return Err(Error::Transport(f.message.clone()));
    }
    Err(Error::Http {
        status: f.status,
        message: f.message.clone(),
        code: None,
        retry_after: f.retry_after_ms.map(Duration::from_millis),
        limits: f.limits.clone().map(Box::new),
    })
}

/// The stream of a turn that succeeds: its rate limits, the model, thinking, tool calls,
/// the text in chunks (each after `chunk_delay_ms`), the usage and the finish.
fn play(turn: &Turn, request: &LlmRequest<'_>, index: usize) -> LlmStream {
    use futures::StreamExt;
    let mut events: Vec<LlmEvent> = turn
        .limits
        .clone()
        .map(LlmEvent::RateLimits)
        .into_iter()
        .collect();
    events.push(LlmEvent::Model(request.model.clone()));
    if let Some(t) = &turn.thinking {
        events.push(LlmEvent::ThinkingDelta(t.clone()));
    }
    let text = substitute(&turn.text, request);
    let text_chunks = chunks(&text, turn.chunk_chars);
    for (i, c) in turn.tool_calls.iter().enumerate() {
        let args = c
            .raw_arguments
            .clone()
            .unwrap_or_else(|| c.arguments.to_string());
        events.push(LlmEvent::ToolCallDelta {
            index: i,
            id: Some(c.id.clone().unwrap_or_else(|| format!("call_{index}_{i}"))),
            name: Some(c.name.clone()),
            arguments: args,
        });
    }
    let usage = turn.usage.unwrap_or(Usage {
        input_tokens: request
            .messages
            .iter()
            .map(|m| m.content.len() as u64 / 4)
            .sum::<u64>()
            + 10,
        output_tokens: (text.len() as u64 / 4).max(1),
        ..Default::default()
    });
    let finish = if turn.tool_calls.is_empty() {
        FinishReason::Stop
    } else {
        FinishReason::ToolCalls
    };
    let chunk_delay = Duration::from_millis(turn.chunk_delay_ms);
    let text_events = futures::stream::iter(text_chunks).then(move |c| async move {
        if !chunk_delay.is_zero() {
            tokio::time::sleep(chunk_delay).await;
        }
        Ok(LlmEvent::TextDelta(c))
    });
    let head = futures::stream::iter(events.into_iter().map(Ok));
    let tail = futures::stream::iter(vec![Ok(LlmEvent::Usage(usage)), Ok(LlmEvent::Done(finish))]);
    Box::pin(head.chain(text_events).chain(tail))
}

#[async_trait]
impl LlmProvider for ScriptedProvider {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn stream(&self, request: &LlmRequest<'_>) -> Result<LlmStream> {
        if request.web_search.is_some() {
            return Err(crate::provider::no_web_search("scripted"));
        }
        let (index, turn) = self.turn_for(request);
        // Only a turn that fails needs its tries counted: counting every turn of every
        // session kept an entry per step for the life of the process.
        let attempt = if turn.fail.is_empty() {
            0
        } else {
            self.attempt(&request.session_id, index)
        };
        if turn.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(turn.delay_ms)).await;
        }
        if let Some(f) = turn.fail.get(attempt) {
            return failure(f);
        }
        Ok(play(&turn, request, index))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::schema::Message;

    fn request(session_id: &str) -> LlmRequest<'static> {
        LlmRequest {
            model: "scripted".into(),
            system: None,
            messages: vec![Message::user("fail: once").into()],
            tools: Vec::new().into(),
            temperature: 0.0,
            max_tokens: 100,
            session_id: session_id.into(),
            web_search: None,
        }
    }

    /// A script whose only turn fails once; unique per test, so that no other test of
    /// this process shares its counts.
    fn failing_once(tag: &str) -> String {
        serde_json::json!({
            "turns": [{"text": tag, "fail": [{"status": 400, "message": "scripted"}]}]
        })
        .to_string()
    }

    #[tokio::test]
    async fn providers_shared_from_one_script_count_attempts_together() {
        let json = failing_once("shared");
        // Two workers' providers: the retry lands on the other one and is answered.
        let (a, b) = (
            ScriptedProvider::shared(&json).unwrap(),
            ScriptedProvider::shared(&json).unwrap(),
        );
        assert!(a.stream(&request("s1")).await.is_err());
        assert!(b.stream(&request("s1")).await.is_ok());
        // Another session has its own count.
        assert!(b.stream(&request("s2")).await.is_err());
        // Providers built on their own keep theirs.
        let json = failing_once("apart");
        let (c, d) = (
            ScriptedProvider::from_json(&json).unwrap(),
            ScriptedProvider::from_json(&json).unwrap(),
        );
        assert!(c.stream(&request("s1")).await.is_err());
        assert!(d.stream(&request("s1")).await.is_err());
    }

    #[tokio::test]
    async fn turns_that_never_fail_keep_no_count() {
        let p = ScriptedProvider::from_json(r#"{"turns": [{"text": "fine"}]}"#).unwrap();
        for i in 0..50 {
            assert!(p.stream(&request(&format!("s{i}"))).await.is_ok());
        }
        assert!(p.attempts.lock().unwrap().is_empty());
        let failing = ScriptedProvider::from_json(&failing_once("counted")).unwrap();
        assert!(failing.stream(&request("s1")).await.is_err());
        assert_eq!(failing.attempts.lock().unwrap().len(), 1);
    }
}
