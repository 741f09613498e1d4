//! The guard pipeline every tool call passes through: cancel check → provider-native skip
//! → tenant/role permission → PreToolUse hooks → execution firewall → guardian → approval
//! → (execute) → PostToolUse hooks. The cheap, certain checks come first, and a human is
//! asked last, only about calls every automatic stage let through. Each stage that says no
//! produces a tool result the model sees, naming the stage.
//!
//! The traits ([`Hook`], [`Guardian`], [`Approver`]) are what a host plugs in; `hook`
//! holds what hooks and the pipeline say to each other, `external` the hooks an operator
//! configures (webhooks and commands), `reviewer` the LLM guardian, `review` the
//! [`Guardian`] trait and the bounds on its reviews of one answer, `shown` what it is shown
//! of a call, `verdict` the answer both hooks and the guardian give.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;

use crate::admission::Admission;
use crate::schema::ToolCall;
use crate::tools::{Tool, ToolOutput};

pub mod external;
pub mod firewall;
pub mod hook;
pub mod review;
pub mod reviewer;
pub mod shown;
pub mod verdict;

pub use external::{ExternalHook, HookOptions, HookTarget};
pub use firewall::Firewall;
pub use hook::{
    Behavior, CONTEXT_PROMPT_MAX_BYTES, Hook, HookContext, HookDecision, HookPoint, OnTruncated,
    bounded,
};
pub use review::{Guardian, MAX_REVIEWS_PER_ANSWER, Review, ReviewCall, ReviewGate, ReviewRound};
pub use reviewer::{DEFAULT_GUARDIAN_PROMPT, GuardianOptions, LlmGuardian};

/// The answer to an approval request for a sensitive tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalDecision {
    Approved,
    Denied(String),
    /// Nobody answered in time.
    TimedOut,
    /// The host cannot wait in-process: the session must suspend until someone answers.
    Suspend,
}

/// Asked before a sensitive tool runs.
#[async_trait]
pub trait Approver: Send + Sync {
    async fn approve(
        &self,
        session_id: &str,
        call: &ToolCall,
        timeout: std::time::Duration,
    ) -> ApprovalDecision;

    /// The arguments a person approved `call` with in place of the model's, asked before
    /// the call enters the pipeline: it then passes every stage (permission, hooks,
    /// firewall, guardian, the tool's own checks) with these, as a model's call would, so
    /// an edit cannot reach what the model's call could not. `Err`: an edit was recorded
    /// but cannot be read (the call must not run). An approver without edits has none.
    async fn edited_arguments(
        &self,
        _session_id: &str,
        _call: &ToolCall,
    ) -> Result<Option<serde_json::Value>, String> {
        Ok(None)
    }
}

/// Which tools a tenant or channel role may use (the pipeline's permission stage).
#[derive(Debug, Clone)]
pub struct Permissions {
    pub can_use_tools: bool,
    /// When set, only these tools.
    pub allowed: Option<HashSet<String>>,
}

impl Default for Permissions {
    fn default() -> Self {
        Permissions {
            can_use_tools: true,
            allowed: None,
        }
    }
}

/// The configured pipeline. `Default` allows everything but the default firewall.
#[derive(Clone, Default)]
pub struct Guards {
    /// The tenant of the session, told to hooks and the guardian.
    pub tenant: String,
    /// Tools the provider executes itself (e.g. native web search): skipped locally.
    pub native_tools: HashSet<String>,
    pub permissions: Permissions,
    pub hooks: Vec<Arc<dyn Hook>>,
    pub firewall: Option<Arc<Firewall>>,
    pub guardian: Option<Arc<dyn Guardian>>,
    /// Admits the guardian's reviews as calls of the session, to the guardian's provider
    /// and model; `None`: the session's own admission.
    pub guardian_admission: Option<Arc<dyn Admission>>,
    pub approver: Option<Arc<dyn Approver>>,
    /// Tools that need approval, on top of the session's own list.
    pub sensitive_tools: HashSet<String>,
}

/// The verdict of the stages before execution.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Run,
    /// Do not run; this is the call's result.
    Result(ToolOutput),
    /// Suspend the session until an approval arrives.
    Suspend,
}

pub(crate) fn denied(stage: &str, reason: &str) -> ToolOutput {
    ToolOutput::error(format!("Tool call denied by {stage}: {reason}"))
}

impl Guards {
    /// The guardian's reviews of an answer's `calls` (`None` without a guardian);
    /// `known` says which calls name a tool the session has.
    pub fn review_round(
        &self,
        calls: &[ToolCall],
        known: impl Fn(&str) -> bool,
        gate: ReviewGate,
    ) -> Option<ReviewRound> {
        let guardian = self.guardian.clone()?;
        let g = guardian.clone();
        Some(ReviewRound::new(
            guardian,
            calls,
            |c| known(&c.name) && !self.native_tools.contains(&c.name) && g.reviews(&c.name),
            gate,
        ))
    }

    /// Every stage up to and including approval, in order. The guardian's stage runs
    /// through `reviews` (see [`Guards::review_round`]).
    pub async fn check(
        &self,
        ctx: &HookContext<'_>,
        call: &ToolCall,
        tool: &dyn Tool,
        session_sensitive: &[String],
        approval_timeout: std::time::Duration,
        reviews: Option<&ReviewRound>,
    ) -> Verdict {
        if self.native_tools.contains(&call.name) {
            return Verdict::Result(ToolOutput::ok(
                "Skipped: this tool is executed natively by the provider.",
            ));
        }
        if !self.permissions.can_use_tools {
            return Verdict::Result(denied("permission", "this session may not use tools"));
        }
        if let Some(allowed) = &self.permissions.allowed
            && !allowed.contains(&call.name)
        {
            return Verdict::Result(denied(
                "permission",
                &format!("tool `{}` is not allowed for this tenant", call.name),
            ));
        }
        for hook in &self.hooks {
            if let HookDecision::Deny(reason) = hook.pre_tool_use(ctx, call).await {
                return Verdict::Result(denied("PreToolUse hook", &reason));
            }
        }
        let arguments = call.arguments.value();
        if let Some(fw) = &self.firewall
            && let Err(reason) = fw.check(tool, &arguments)
        {
            return Verdict::Result(denied("firewall", &reason));
        }
        if let Some(g) = &self.guardian
            && g.reviews(&call.name)
        {
            let decision = match reviews {
                Some(round) => round.review(ctx, call, &tool.paths(&arguments)).await,
                // Never reached through the driver; a host that forgets the round must
                // not get its calls through unreviewed.
                None => HookDecision::Deny("the guardian could not review the call".into()),
            };
            if let HookDecision::Deny(reason) = decision {
                return Verdict::Result(denied("guardian", &reason));
            }
        }
        if self.needs_approval(&call.name, session_sensitive) {
            let Some(approver) = &self.approver else {
                return Verdict::Result(denied(
                    "approval",
                    "the tool needs a human approval and no approver is configured",
                ));
            };
            match approver
                .approve(ctx.session_id, call, approval_timeout)
                .await
            {
                ApprovalDecision::Approved => {}
                ApprovalDecision::Denied(reason) => {
                    return Verdict::Result(denied("approval", &reason));
                }
                ApprovalDecision::TimedOut => {
                    return Verdict::Result(denied("approval", "timeout"));
                }
                ApprovalDecision::Suspend => return Verdict::Suspend,
            }
        }
        Verdict::Run
    }

    /// The tool is sensitive, for this host or for this session.
    pub fn needs_approval(&self, tool: &str, session_sensitive: &[String]) -> bool {
        self.sensitive_tools.contains(tool) || session_sensitive.iter().any(|t| t == tool)
    }

    /// Whether the pipeline can reach anything outside this process for `tool`: a hook
    /// (which may notify or record), or an approval request (which a human sees). A call
    /// whose pipeline does neither, of a tool with no side effect, changes nothing
    /// anywhere if it runs and its result is then lost.
    pub fn reaches_out(&self, tool: &str, session_sensitive: &[String]) -> bool {
        !self.hooks.is_empty() || self.needs_approval(tool, session_sensitive)
    }

    /// PostToolUse, fire and forget.
    pub fn post_tool_use(&self, ctx: &HookContext<'_>, call: &ToolCall, output: &ToolOutput) {
        if self.hooks.is_empty() {
            return;
        }
        let owned = Arc::new((
            ctx.session_id.to_string(),
            ctx.tenant.to_string(),
            ctx.prompt.to_string(),
            call.clone(),
            output.clone(),
        ));
        let iteration = ctx.iteration;
        for hook in &self.hooks {
            let hook = hook.clone();
            let owned = owned.clone();
            tokio::spawn(async move {
                let (session_id, tenant, prompt, call, out) = &*owned;
                let ctx = HookContext {
                    session_id,
                    tenant,
                    iteration,
                    prompt,
                };
                hook.post_tool_use(&ctx, call, out).await
            });
        }
    }
}
