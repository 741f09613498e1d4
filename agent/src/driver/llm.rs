//! One LLM call as the loop makes it: admitted by the host's [`Admission`] before every
//! try, streamed, bounded by the session deadline, abandoned on cancel or interrupt,
//! measured, and retried on transient failures.
//!
//! Two kinds of "not now" are kept apart. A rate limit — the admission saying wait, or
//! the provider refusing with 429 (or Anthropic's 529) — is waited out and never spends
//! the retry allowance, which is kept for real failures (5xx, transport, undecodable
//! answers). A wait longer than [`Agent::suspend_after`] gives the session up instead of
//! holding its slot: the run ends suspended, with nothing of the call recorded, and the
//! host wakes it when capacity is expected back.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span, info_span};

use super::Agent;
use super::stream::{Assembled, StreamAssembler, is_token};
use crate::admission::{
    Admit, CallAsk, CallReport, Permit, estimate_with_tools, refusal_wait, unanswered,
};
use crate::bounds;
use crate::error::{Error, ErrorClass, Result};
use crate::event::AgentEvent;
use crate::observe::{LlmCallInfo, outcome_of};
use crate::provider::{LlmEvent, LlmRequest, RateLimitInfo};
use crate::schema::Usage;
use crate::spec::{ExitReason, WEB_SEARCH_TOOL};
use crate::state::{Outcome, SessionState, SuspendReason};

/// How an LLM call (with its retries) ended.
pub(super) enum Attempt {
    /// Boxed: an answer is far larger than the other outcomes.
    Got(Box<Assembled>),
    Ended(Outcome),
    /// The user interrupted the turn: drop the call, keep looping.
    Interrupted,
    /// The call would wait too long for a rate limit, or its budget is parked: give the
    /// session up without recording anything of the call.
    Suspended(SuspendReason),
}

/// What one try of the call came to.
enum Try {
    /// Done with the call: an answer, or a reason to stop trying.
    Over(Attempt),
    /// Failed; `label` is the outcome the observer was told.
    Failed { err: Error, label: &'static str },
}

/// What every try of one call shares.
struct CallCtx<'a> {
    /// The history position of the message being produced (events belong to it).
    seq: usize,
    request: &'a LlmRequest<'a>,
    cancel: &'a CancellationToken,
    interrupt: CancellationToken,
    provider: &'a str,
    /// What the admission is asked for every try.
    ask: CallAsk<'a>,
}

/// The shortest wait for admission: a limiter answering "wait 0" must not make the loop
/// spin on its round trips.
const MIN_ADMISSION_WAIT: Duration = Duration::from_millis(5);

/// The delay before the retry after failed try number `attempt` (0-based), or `None` when
/// the failure is not worth retrying or the retries are spent. The delay grows linearly
/// from `base` and never undercuts what the server asked for.
pub(super) fn retry_delay(
    class: ErrorClass,
    attempt: u32,
    max_retries: u32,
    base: Duration,
) -> Option<Duration> {
    match class {
        ErrorClass::Retryable { after } if attempt < max_retries => {
            let linear = base
                .checked_mul(attempt.saturating_add(1))
                .unwrap_or(Duration::MAX);
            Some(linear.max(after.unwrap_or(Duration::ZERO)))
        }
        _ => None,
    }
}

impl Agent {
    /// The LLM call with its admission and retry policy: every try is admitted first
    /// (waiting as the admission says); a rate-limit refusal is waited out; other
    /// transient failures (transport, 5xx, an empty error finish) are retried up to
    /// `max_llm_retries` times with a growing delay that honours `Retry-After`; anything
    /// else ends the session with the provider's message.
    ///
    /// With how it ended, what a try abandoned in flight (interrupted, cancelled, past the
    /// deadline) is counted as having spent: the admission settled it so (see
    /// [`unanswered`]), and the session's usage must count it too.
    pub(super) async fn call_with_retry(
        &self,
        state: &SessionState,
        request: &LlmRequest<'_>,
        tools_bytes: usize,
        cancel: &CancellationToken,
    ) -> (Attempt, Option<Usage>) {
        let mut abandoned = None;
        let attempt = self
            .call_tries(state, request, tools_bytes, cancel, &mut abandoned)
            .await;
        (attempt, abandoned)
    }

    async fn call_tries(
        &self,
        state: &SessionState,
        request: &LlmRequest<'_>,
        tools_bytes: usize,
        cancel: &CancellationToken,
        abandoned: &mut Option<Usage>,
    ) -> Attempt {
        let ctx = CallCtx {
            seq: state.messages.len(),
            request,
            cancel,
            interrupt: self.interrupter.token(),
            provider: self.provider.name(),
            ask: CallAsk {
                model: &request.model,
                input_tokens: estimate_with_tools(request, tools_bytes),
                max_output_tokens: u64::from(request.max_tokens),
                web_searches: request
                    .web_search
                    .as_ref()
                    .map_or(0, |w| u64::from(w.max_uses())),
                max_wait: self.bookable_wait(state),
            },
        };
        let max_retries = state.spec.max_llm_retries.unwrap_or(self.max_llm_retries);
        let base = crate::bounds::millis(state.spec.retry_delay_ms);
        let mut attempt: u32 = 0;
        let mut refusals: u32 = 0;
        loop {
            if cancel.is_cancelled() {
                return Attempt::Ended(Outcome::new(ExitReason::Interrupted));
            }
            if ctx.interrupt.is_cancelled() {
                return Attempt::Interrupted;
            }
            let permit = match self.admit(&ctx, state).await {
                Ok(p) => p,
                Err(end) => return end,
            };
            let (tried, report) = self.try_once(&ctx, state, attempt).await;
            self.admission.settle(&ctx.ask, permit, &report).await;
            let (err, label) = match tried {
                Try::Over(a) => {
                    if !matches!(a, Attempt::Got(_)) {
                        *abandoned = report.usage;
                    }
                    return a;
                }
                Try::Failed { err, label } => (err, label),
            };
            if let Some(retry_after) = report.rate_limited {
                self.observer
                    .llm_rate_limited(ctx.provider, &ctx.request.model);
                let wait = refusal_wait(retry_after, report.limits.as_ref(), refusals);
                refusals = refusals.saturating_add(1);
                tracing::info!(error = %err, ?wait, "LLM call refused for a rate limit; waiting");
                if let Some(end) = self.wait_for_capacity(&ctx, state, wait, "provider").await {
                    return end;
                }
                continue;
            }
            let Some(delay) = retry_delay(err.class(), attempt, max_retries, base) else {
                return self.give_up(&ctx, attempt, &err);
            };
            self.observer.llm_retry(ctx.provider, label);
            tracing::info!(error = %err, attempt, ?delay, "LLM call failed; retrying");
            self.events.emit(
                ctx.seq,
                AgentEvent::Error {
                    message: format!("{err} (retrying in {:.1}s)", delay.as_secs_f64()),
                    retrying: true,
                },
            );
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = cancel.cancelled() => return Attempt::Ended(Outcome::new(ExitReason::Interrupted)),
                _ = ctx.interrupt.cancelled() => return Attempt::Interrupted,
            }
            attempt += 1;
        }
    }

    /// The longest start the admission may book for a call of this session: no later
    /// than the wait that would suspend it, nor past its deadline.
    fn bookable_wait(&self, state: &SessionState) -> Duration {
        let mut most = if self.suspend_after.is_zero() {
            Duration::MAX
        } else {
            self.suspend_after
        };
        if let Some(deadline) = state.deadline() {
            let left = (deadline - chrono::Utc::now()).to_std().unwrap_or_default();
            most = most.min(left);
        }
        most
    }

    /// Ask the admission until it lets the try start (`Ok`), or the call cannot go on.
    async fn admit(&self, ctx: &CallCtx<'_>, state: &SessionState) -> Result<Permit, Attempt> {
        let started = Instant::now();
        let mut late_asks = 0u32;
        loop {
            match self.admission.reserve(&ctx.ask).await {
                Admit::Go(permit) => {
                    if !permit.start_after.is_zero() {
                        self.events.emit(
                            ctx.seq,
                            AgentEvent::RateLimited {
                                wait_ms: u64::try_from(permit.start_after.as_millis())
                                    .unwrap_or(u64::MAX),
                                reason: permit.waits_for.to_string(),
                            },
                        );
                        let stop = tokio::select! {
                            _ = tokio::time::sleep(permit.start_after) => None,
                            _ = ctx.cancel.cancelled() => {
                                Some(Attempt::Ended(Outcome::new(ExitReason::Interrupted)))
                            }
                            _ = ctx.interrupt.cancelled() => Some(Attempt::Interrupted),
                        };
                        if let Some(stop) = stop {
                            self.admission
                                .settle(&ctx.ask, permit, &CallReport::UNSENT)
                                .await;
                            return Err(stop);
                        }
                    }
                    if permit.ask_again(&mut late_asks) {
                        tracing::info!("LLM call would start late for its booking; asking again");
                        self.observer
                            .admission_late(ctx.provider, &ctx.request.model);
                        self.admission
                            .settle(&ctx.ask, permit, &CallReport::UNSENT)
                            .await;
                        continue;
                    }
                    self.observer.admission_wait(
                        ctx.provider,
                        &ctx.request.model,
                        started.elapsed(),
                    );
                    return Ok(permit);
                }
                Admit::Wait { after, reason } => {
                    let after = after.max(MIN_ADMISSION_WAIT);
                    if let Some(end) = self.wait_for_capacity(ctx, state, after, reason).await {
                        return Err(end);
                    }
                }
                Admit::Children { after } => {
                    if self.suspend_after.is_zero() {
                        let after = after.max(MIN_ADMISSION_WAIT);
                        if let Some(end) = self.wait_for_capacity(ctx, state, after, "budget").await
                        {
                            return Err(end);
                        }
                    } else {
                        return Err(Attempt::Suspended(SuspendReason::Children));
                    }
                }
                Admit::Exhausted { message, park } => {
                    self.events.emit(
                        ctx.seq,
                        AgentEvent::Error {
                            message: message.clone(),
                            retrying: park,
                        },
                    );
                    return Err(if park {
                        Attempt::Suspended(SuspendReason::Budget { message })
                    } else {
                        Attempt::Ended(Outcome {
                            reason: ExitReason::BudgetExhausted,
                            result: None,
                            error: Some(message),
                        })
                    });
                }
            }
        }
    }

    /// Wait `wait` for capacity (`None` once waited), or say how the call ends instead:
    /// past the session deadline it times out, beyond [`Agent::suspend_after`] it
    /// suspends until then, and a cancel or an interrupt stops it at once.
    async fn wait_for_capacity(
        &self,
        ctx: &CallCtx<'_>,
        state: &SessionState,
        wait: Duration,
        reason: &'static str,
    ) -> Option<Attempt> {
        self.events.emit(
            ctx.seq,
            AgentEvent::RateLimited {
                wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                reason: reason.to_string(),
            },
        );
        let now = chrono::Utc::now();
        let until = chrono::Duration::from_std(wait)
            .ok()
            .and_then(|w| now.checked_add_signed(w))
            .unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC);
        if let Some(deadline) = state.deadline()
            && until >= deadline
        {
            return Some(Attempt::Ended(Outcome {
                reason: ExitReason::Timeout,
                result: None,
                error: Some(format!(
                    "session deadline reached: the LLM call would wait {:.1}s for a rate \
                     limit ({reason})",
                    wait.as_secs_f64()
                )),
            }));
        }
        if !self.suspend_after.is_zero() && wait > self.suspend_after {
            return Some(Attempt::Suspended(SuspendReason::RateLimit { until }));
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => None,
            _ = ctx.cancel.cancelled() => Some(Attempt::Ended(Outcome::new(ExitReason::Interrupted))),
            _ = ctx.interrupt.cancelled() => Some(Attempt::Interrupted),
        }
    }

    /// The call failed for good: say so and end the session.
    fn give_up(&self, ctx: &CallCtx<'_>, attempt: u32, err: &Error) -> Attempt {
        let message = if attempt > 0 {
            format!("LLM call failed after {} attempts: {err}", attempt + 1)
        } else {
            format!("LLM call failed: {err}")
        };
        self.events.emit(
            ctx.seq,
            AgentEvent::Error {
                message: message.clone(),
                retrying: false,
            },
        );
        Attempt::Ended(Outcome::error(message))
    }

    /// One try, within what is left of the session deadline, reported to the observer;
    /// with what the admission is told of it.
    async fn try_once(
        &self,
        ctx: &CallCtx<'_>,
        state: &SessionState,
        attempt: u32,
    ) -> (Try, CallReport) {
        let request = ctx.request;
        let span = info_span!(
            "chat",
            otel.name = %format!("chat {}", request.model),
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = %ctx.provider,
            gen_ai.request.model = %request.model,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            attempt,
        );
        let started = Instant::now();
        let seen = Seen::default();
        let call = async {
            tokio::select! {
                r = self.call_once(ctx.seq, request, ctx.cancel, started, &seen) => Some(r),
                _ = ctx.interrupt.cancelled() => None,
            }
        }
        .instrument(span.clone());
        let Seen {
            first_token: ttft,
            limits,
            searches,
        } = &seen;
        let unanswered = || unanswered(&ctx.ask, searches.load(Ordering::Relaxed));
        let taken =
            |m: &Mutex<Option<RateLimitInfo>>| m.lock().unwrap_or_else(|e| e.into_inner()).take();
        let result = match state.deadline() {
            Some(d) => {
                let left = d
                    .signed_duration_since(chrono::Utc::now())
                    .to_std()
                    .unwrap_or(Duration::ZERO);
                match tokio::time::timeout(left, call).await {
                    Ok(r) => r,
                    Err(_) => {
                        let report = CallReport {
                            usage: Some(unanswered()),
                            limits: taken(limits),
                            ..CallReport::default()
                        };
                        return (
                            Try::Over(Attempt::Ended(Outcome {
                                reason: ExitReason::Timeout,
                                result: None,
                                error: Some("session deadline reached during an LLM call".into()),
                            })),
                            report,
                        );
                    }
                }
            }
            None => call.await,
        };
        let mut report = CallReport {
            limits: taken(limits),
            ..CallReport::default()
        };
        let Some(result) = result else {
            report.usage = Some(unanswered());
            return (Try::Over(Attempt::Interrupted), report);
        };
        match &result {
            Ok(r) => report.usage = r.message.usage,
            Err(Error::Cancelled) => report.usage = Some(unanswered()),
            Err(e) => {
                report.rate_limited = e.rate_limited();
                if let Some(l) = e.rate_limits() {
                    report.limits = Some(l.clone());
                }
            }
        }
        let first_token = *ttft.lock().unwrap_or_else(|e| e.into_inner());
        (
            self.observe_try(ctx, &span, started, first_token, result),
            report,
        )
    }

    /// Tell the observer (and the span) how a try went, and classify it.
    fn observe_try(
        &self,
        ctx: &CallCtx<'_>,
        span: &Span,
        started: Instant,
        first_token: Option<Duration>,
        result: Result<Assembled>,
    ) -> Try {
        let report = |model: &str, outcome: &'static str, usage: Option<Usage>| {
            self.observer.llm_call(&LlmCallInfo {
                provider: ctx.provider,
                model,
                outcome,
                duration: started.elapsed(),
                time_to_first_token: first_token,
                usage,
            });
        };
        let err = match result {
            Ok(r) if !r.empty_error => {
                let usage = r.message.usage;
                if let Some(u) = &usage {
                    span.record("gen_ai.usage.input_tokens", u.input_tokens);
                    span.record("gen_ai.usage.output_tokens", u.output_tokens);
                }
                let model = r.message.model.as_deref().unwrap_or(&ctx.request.model);
                report(model, "ok", usage);
                return Try::Over(Attempt::Got(Box::new(r)));
            }
            Ok(_) => Error::Stream {
                message: "the model returned an error finish with no content".into(),
                code: None,
                retryable: true,
            },
            Err(Error::Cancelled) => {
                report(&ctx.request.model, "cancelled", None);
                return Try::Over(Attempt::Ended(Outcome::new(ExitReason::Interrupted)));
            }
            Err(e) => e,
        };
        let label = match &err {
            Error::Stream { code: None, .. } => "empty_error",
            e => outcome_of(e),
        };
        report(&ctx.request.model, label, None);
        Try::Failed { err, label }
    }

    /// One streamed call, assembled into an assistant message. Text and thinking deltas
    /// are emitted as they arrive; what a try that is abandoned must still be counted
    /// for is noted in `seen`.
    async fn call_once(
        &self,
        seq: usize,
        request: &LlmRequest<'_>,
        cancel: &CancellationToken,
        started: Instant,
        seen: &Seen,
    ) -> Result<Assembled> {
        let Seen {
            first_token,
            limits,
            searches,
        } = seen;
        let mut stream = tokio::select! {
            s = self.provider.stream(request) => s?,
            _ = cancel.cancelled() => return Err(Error::Cancelled),
        };
        let mut assembler = StreamAssembler::default();
        let mut emit = |e: AgentEvent| self.events.emit(seq, e);
        let mut first_seen = false;
        let mut bytes = 0usize;
        let mut output = 0usize;
        let max_output = bounds::answer_bytes(request.max_tokens);
        loop {
            let ev = tokio::select! {
                ev = stream.next() => ev,
                _ = cancel.cancelled() => return Err(Error::Cancelled),
            };
            let Some(ev) = ev else { break };
            let ev = ev?;
            if let LlmEvent::RateLimits(l) = ev {
                *limits.lock().unwrap_or_else(|e| e.into_inner()) = Some(l);
                continue;
            }
            if !first_seen && is_token(&ev) {
                first_seen = true;
                let mut f = first_token.lock().unwrap_or_else(|e| e.into_inner());
                if f.is_none() {
                    *f = Some(started.elapsed());
                }
            }
            if let LlmEvent::ServerToolDelta {
                name: Some(name), ..
            } = &ev
                && name == WEB_SEARCH_TOOL
            {
                searches.fetch_add(1, Ordering::Relaxed);
            }
            bytes = bytes.saturating_add(event_bytes(&ev));
            output = output.saturating_add(output_bytes(&ev));
            if output > max_output {
                return Err(Error::Stream {
                    message: format!(
                        "the model's answer is over {max_output} bytes, more than its \
                         max_tokens ({}) can produce; the call was stopped",
                        request.max_tokens
                    ),
                    code: Some("response_too_large".into()),
                    retryable: false,
                });
            }
            if bytes > bounds::MAX_RESPONSE_BYTES {
                return Err(Error::Stream {
                    message: format!(
                        "the model's answer is over {} bytes; the call was stopped",
                        bounds::MAX_RESPONSE_BYTES
                    ),
                    code: Some("response_too_large".into()),
                    retryable: false,
                });
            }
            assembler.push(ev, &mut emit);
        }
        Ok(assembler.finish(&request.model, &mut emit))
    }
}

/// What one try has seen of its answer so far, kept past the try when it is abandoned.
#[derive(Default)]
struct Seen {
    first_token: Mutex<Option<Duration>>,
    /// The rate-limit state the answer's headers announced.
    limits: Mutex<Option<RateLimitInfo>>,
    /// Web searches the answer started (the provider bills each).
    searches: AtomicU64,
}

/// The bytes of output tokens `ev` carries: text, thinking, tool-call arguments and the
/// input of a use of the provider's own tool (signatures, ids and what the provider's
/// tools gave back are not tokens the model generates).
fn output_bytes(ev: &LlmEvent) -> usize {
    match ev {
        LlmEvent::TextDelta(s) | LlmEvent::ThinkingDelta(s) => s.len(),
        LlmEvent::ToolCallDelta { arguments, .. } => arguments.len(),
        LlmEvent::ServerToolDelta { input, .. } => input.len(),
        _ => 0,
    }
}

/// The bytes `ev` adds to the answer being assembled.
fn event_bytes(ev: &LlmEvent) -> usize {
    match ev {
        LlmEvent::TextDelta(s)
        | LlmEvent::ThinkingDelta(s)
        | LlmEvent::ThinkingSignature(s)
        | LlmEvent::RedactedThinking(s)
        | LlmEvent::Model(s) => s.len(),
        LlmEvent::ToolCallDelta {
            id,
            name,
            arguments,
            ..
        }
        | LlmEvent::ServerToolDelta {
            id,
            name,
            input: arguments,
            ..
        } => arguments
            .len()
            .saturating_add(id.as_deref().map_or(0, str::len))
            .saturating_add(name.as_deref().map_or(0, str::len)),
        LlmEvent::ServerToolResult {
            tool_use_id,
            kind,
            content,
        } => json_bytes(content)
            .saturating_add(tool_use_id.len())
            .saturating_add(kind.len()),
        LlmEvent::Citation(c) => json_bytes(c),
        // A block start costs the assembler a mark: counted, so that an endless run of
        // empty blocks meets the bound too.
        LlmEvent::TextBlock => BLOCK_MARK_BYTES,
        LlmEvent::Usage(_) | LlmEvent::Done(_) | LlmEvent::RateLimits(_) => 0,
    }
}

/// What a text block's start is counted as towards the answer's bound (about what the
/// assembler keeps for it).
const BLOCK_MARK_BYTES: usize = 64;

/// The length of `v` as JSON, counted without writing it anywhere.
fn json_bytes(v: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    // Writing a `Value` to a sink that never fails cannot fail.
    let _ = serde_json::to_writer(&mut n, v);
    n.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delays_grow_linearly_honour_retry_after_and_stop() {
        let base = Duration::from_millis(100);
        let retry = |after| ErrorClass::Retryable { after };
        assert_eq!(
            retry_delay(retry(None), 0, 2, base),
            Some(Duration::from_millis(100))
        );
        assert_eq!(
            retry_delay(retry(None), 1, 2, base),
            Some(Duration::from_millis(200))
        );
        assert_eq!(retry_delay(retry(None), 2, 2, base), None, "retries spent");
        assert_eq!(
            retry_delay(retry(Some(Duration::from_secs(3))), 0, 2, base),
            Some(Duration::from_secs(3)),
            "the server's Retry-After wins when longer"
        );
        assert_eq!(
            retry_delay(retry(Some(Duration::from_millis(10))), 1, 2, base),
            Some(Duration::from_millis(200))
        );
        assert_eq!(retry_delay(ErrorClass::Fatal, 0, 2, base), None);
        // A configured delay too large to multiply saturates instead of panicking.
        assert_eq!(
            retry_delay(retry(None), 3, 9, Duration::MAX),
            Some(Duration::MAX)
        );
    }
}
