//! Admission of LLM calls: whether a call may start now, and what it cost once it ended;
//! and the arithmetic of both that the loop and the guardian's reviewer share (a
//! prompt's estimate, what an unanswered call spent, the wait after a refusal).
//!
//! The loop asks its [`Admission`] before every try of an LLM call and reports to it after.
//! The host decides what stands behind it: a fleet-wide rate limiter (requests, tokens and
//! calls in flight per provider endpoint, model and key), the budgets of the session's tree
//! and tenant, or nothing at all ([`NoAdmission`]). Waiting for admission is not a failed
//! try: it never spends the session's retry allowance.

use std::time::Duration;

use async_trait::async_trait;

use crate::provider::LlmRequest;
use crate::provider::ratelimit::RateLimitInfo;
use crate::schema::{ServerBlock, ToolSpec, Usage};

/// What the loop knows about a call before it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct CallAsk<'a> {
    /// The model the request names.
    pub model: &'a str,
    /// Prompt tokens, estimated from the request's size.
    pub input_tokens: u64,
    /// The request's `max_tokens`: the most the answer can cost.
    pub max_output_tokens: u64,
    /// The most web searches the provider may run for the call (its `max_uses`; 0 when
    /// the request offers no search): priced per search, part of its worst case.
    pub web_searches: u64,
    /// The longest the call may be told to wait before it starts ([`Permit::start_after`]):
    /// an admission that can book a later start takes no more than this. Zero books
    /// nothing: the answer is go now, or wait and ask again.
    pub max_wait: Duration,
}

/// Leave to start a call, handed back to [`Admission::settle`] when the call has ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Permit {
    /// What the admitting side needs to find its reservation again (empty for none).
    pub id: String,
    /// The tokens reserved for the call.
    pub reserved_tokens: u64,
    /// The call is admitted from this long on, not before: the admission booked its
    /// place in a window that has room then (at most [`CallAsk::max_wait`]), so the
    /// caller waits and starts without asking again. The permit is settled in any case,
    /// a call abandoned before its start too.
    pub start_after: Duration,
    /// What the booked wait waits for (`rpm`, `tpm`), empty when there is none.
    pub waits_for: &'static str,
    /// The latest the call may start and still count where the admission booked it
    /// (`None`: whenever it starts). A call later than that (its worker starved, its
    /// host paused, its gates slow to answer) gives its booking back
    /// ([`CallReport::unsent`]) and asks again, at most [`MAX_LATE_ASKS`] times: a
    /// booking honoured late would put calls booked a window apart into one window of
    /// the provider's.
    pub start_by: Option<tokio::time::Instant>,
}

/// The most times one try gives back a booking it would honour late and asks again;
/// past that it goes late (the provider's refusal, if it comes, is handled as any).
pub const MAX_LATE_ASKS: u32 = 3;

impl Permit {
    /// Whether the call gives this permit back and asks again: it would start later now
    /// than its booking allows ([`Permit::start_by`]), and its try has asked again fewer
    /// than [`MAX_LATE_ASKS`] times (`late_asks`, counted here).
    pub fn ask_again(&self, late_asks: &mut u32) -> bool {
        let again = *late_asks < MAX_LATE_ASKS
            && self
                .start_by
                .is_some_and(|by| tokio::time::Instant::now() > by);
        if again {
            *late_asks += 1;
        }
        again
    }
}

/// The answer to [`Admission::reserve`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Start the call now.
    Go(Permit),
    /// Not now: ask again after this long. `reason` names what is short (`rpm`, `tpm`,
    /// `concurrency`, `provider` for a limit the provider announced).
    Wait {
        after: Duration,
        reason: &'static str,
    },
    /// Not until the session's running sub-agents give back what they hold of its budget
    /// (they give back what they do not spend when they end). A host that can suspend
    /// gives its slot up and waits for them, as for children it waits on: the slot it
    /// would hold could be the one they need to run. One that cannot (a guardian review)
    /// asks again after `after`.
    Children { after: Duration },
    /// A budget is spent: the session must not make the call. With `park` it waits until the
    /// budget is raised (or its period turns over); otherwise it ends with
    /// `budget_exhausted`. `message` says which budget.
    Exhausted { message: String, park: bool },
}

/// How a call the admission let through went.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallReport {
    /// The usage the provider reported, when it answered.
    pub usage: Option<Usage>,
    /// The rate-limit state the provider's answer announced (its headers), if any.
    pub limits: Option<RateLimitInfo>,
    /// The provider refused the call for its rate limit (HTTP 429, or Anthropic's 529):
    /// `Some(retry_after)`, the wait it asked for when it said.
    pub rate_limited: Option<Option<Duration>>,
    /// The call was never sent (abandoned before its start, refused by a later gate, or
    /// given back as late): the admission takes its booking back as if never made.
    pub unsent: bool,
}

impl CallReport {
    /// The report of a call that never went out.
    pub const UNSENT: CallReport = CallReport {
        usage: None,
        limits: None,
        rate_limited: None,
        unsent: true,
    };
}

/// The gate every LLM call passes. One value serves one session (the host builds it with
/// whatever it needs to know: tenant, tree, provider endpoint and key).
#[async_trait]
pub trait Admission: Send + Sync {
    /// Ask to start a call described by `ask`.
    async fn reserve(&self, ask: &CallAsk<'_>) -> Admit;

    /// The call let through by `permit` has ended, as `report` says. Called once per
    /// [`Admit::Go`], whatever the outcome (cancelled and failed calls too).
    async fn settle(&self, ask: &CallAsk<'_>, permit: Permit, report: &CallReport);
}

/// Admits every call at once: `agentq run` and hosts without limits.
pub struct NoAdmission;

#[async_trait]
impl Admission for NoAdmission {
    async fn reserve(&self, _ask: &CallAsk<'_>) -> Admit {
        Admit::Go(Permit::default())
    }

    async fn settle(&self, _ask: &CallAsk<'_>, _permit: Permit, _report: &CallReport) {}
}

/// The wait after a rate-limit refusal that named no wait of its own: doubling from this,
/// up to [`MAX_REFUSAL_BACKOFF`].
const REFUSAL_BACKOFF: Duration = Duration::from_millis(100);
const MAX_REFUSAL_BACKOFF: Duration = Duration::from_secs(60);

/// The wait after the `refusals`-th (0-based) rate-limit refusal in a row of one call:
/// what the provider asked for (`retry-after`, or the reset of the window its headers say
/// is spent), and never less than a floor that doubles with each refusal, so that a
/// server answering 429 with no (or a zero) wait is not hammered.
pub(crate) fn refusal_wait(
    retry_after: Option<Duration>,
    limits: Option<&RateLimitInfo>,
    refusals: u32,
) -> Duration {
    let floor = REFUSAL_BACKOFF
        .checked_mul(1u32.checked_shl(refusals.min(16)).unwrap_or(u32::MAX))
        .unwrap_or(MAX_REFUSAL_BACKOFF)
        .min(MAX_REFUSAL_BACKOFF);
    let asked = retry_after
        .or_else(|| limits.and_then(RateLimitInfo::exhausted_for))
        .unwrap_or(Duration::ZERO);
    asked.max(floor)
}

/// What a call abandoned in flight (interrupted, cancelled, timed out) is counted as
/// having spent: its prompt's estimate, and the web searches the answer had started
/// (`searches`, each billed once started). The provider had the prompt and bills it, but
/// the answer that would report the usage never comes; counted as nothing, a caller who
/// interrupts or cancels each call as it starts would spend without any budget seeing it.
pub(crate) fn unanswered(ask: &CallAsk<'_>, searches: u64) -> Usage {
    Usage {
        input_tokens: ask.input_tokens,
        web_search_requests: searches,
        ..Usage::default()
    }
}

/// Prompt tokens of `request`, estimated as its text bytes / 4 (the usual rule of thumb
/// for English text and JSON with BPE tokenizers). Good enough to reserve against a
/// tokens-per-minute limit: the call settles with the usage the provider reports, and the
/// provider's own count differs from any local one anyway. Counts the text that goes
/// out — system prompt, message contents, thinking, tool calls, what the provider's own
/// tools ran in earlier answers, and tool schemas — without serializing the request a
/// second time.
pub fn estimate_input_tokens(request: &LlmRequest<'_>) -> u64 {
    estimate_with_tools(request, tools_len(&request.tools))
}

/// The bytes [`estimate_input_tokens`] counts for `tools`: a run's tools are the same on
/// every call, so the loop counts them once (their schemas are the largest part of a
/// short history's estimate).
pub fn tools_len(tools: &[ToolSpec]) -> usize {
    tools
        .iter()
        .map(|t| {
            t.name
                .len()
                .saturating_add(t.description.len())
                .saturating_add(json_len(&t.parameters))
        })
        .fold(0, usize::saturating_add)
}

/// [`estimate_input_tokens`] with the tools counted already: `tools_bytes` is [`tools_len`]
/// of the tools the request offers whenever it offers any (a request may offer none).
pub fn estimate_with_tools(request: &LlmRequest<'_>, tools_bytes: usize) -> u64 {
    let mut bytes = request.system.as_deref().map_or(0, str::len);
    for m in &request.messages {
        bytes = bytes.saturating_add(m.content.len());
        if request.web_search.is_some() {
            bytes = bytes.saturating_add(server_content_len(&m.server_content));
        }
        for t in &m.thinking {
            bytes = bytes.saturating_add(t.text.len());
        }
        for c in &m.tool_calls {
            bytes = bytes
                .saturating_add(c.name.len())
                .saturating_add(c.arguments.text().len());
        }
    }
    if !request.tools.is_empty() {
        bytes = bytes.saturating_add(tools_bytes);
    }
    (bytes as u64).div_ceil(4)
}

/// What an answer's server blocks add to a request beside its text (which `content`
/// holds already): the uses' inputs and the results, as JSON.
fn server_content_len(blocks: &[ServerBlock]) -> usize {
    blocks
        .iter()
        .map(|b| match b {
            ServerBlock::Text { citations, .. } => citations
                .iter()
                .map(json_len)
                .fold(0, usize::saturating_add),
            ServerBlock::ToolUse { name, input, .. } => name.len().saturating_add(json_len(input)),
            ServerBlock::ToolResult { content, .. } => json_len(content),
        })
        .fold(0usize, usize::saturating_add)
}

/// The length of `v` as compact JSON (a string's text alone), counted as it is written:
/// every call counts every tool schema, and building each as a `String` to take its
/// length was one allocation per schema per call on the hot path.
pub fn json_len(v: &serde_json::Value) -> usize {
    match v {
        serde_json::Value::Null => 0,
        serde_json::Value::String(s) => s.len(),
        other => {
            let mut counter = ByteCount(0);
            // Writing to a counter cannot fail, and a `Value` always encodes.
            let _ = serde_json::to_writer(&mut counter, other);
            counter.0
        }
    }
}

/// An `io::Write` that keeps only how many bytes went through it.
struct ByteCount(usize);

impl std::io::Write for ByteCount {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 = self.0.saturating_add(buf.len());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
