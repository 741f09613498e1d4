//! The `spawn_agent` tool: a child session on the same queue, with the parent's provider
//! and limits (narrowed, never widened). `wait: true` suspends the parent until the child
//! finishes and returns its answer; `wait: false` returns at once and the child's result
//! is injected later. Creating the child is idempotent per tool call, so a parent that
//! resumes runs the call again and finds the same child.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use serde_json::{Value, json};

use agentq_agent::tools::{SideEffect, Tool, ToolContext, ToolError, ToolOutput};
use agentq_core::budget::{SpawnBudget, SpawnLimits, Spawned};
use agentq_core::policy::{Policy, Sent, SpawnContext};
use agentq_core::{
    EnqueueReason, ListFilter, NewSession, Queue, SessionRow, SessionStatus, SpawnInfo, Store,
};

use crate::inbox::SessionInbox;

pub const NAME: &str = "spawn_agent";

pub struct SpawnAgent {
    pub store: Arc<dyn Store>,
    pub queue: Arc<dyn Queue>,
    pub parent: SessionRow,
    /// The parent's tools: a child gets these or fewer.
    pub parent_tools: Vec<String>,
    /// The lower of the worker's limit and the tenant's policy.
    pub max_depth: u32,
    /// The lower of the worker's limit and the tenant's policy.
    pub max_children: usize,
    /// Longest prompt a child may be given, in bytes (`scheduler.max_prompt_bytes`).
    pub max_prompt_bytes: usize,
    /// A child passes its tenant's policy as a root session does.
    pub policy: Arc<Policy>,
    pub tenant: String,
    pub inbox: Arc<SessionInbox>,
    /// Sessions the parent's tree may create, root included (the tenant's policy).
    pub max_tree_sessions: u64,
    /// The parent's spend as its run knows it (its budget gates count it as each call
    /// settles): the guardian's reviews of this round are in it before they are stored.
    pub parent_spent: Arc<AtomicU64>,
    /// Parallel calls of one response check the child limit and create under this lock,
    /// so the limit holds however many arrive at once.
    pub creating: tokio::sync::Mutex<()>,
}

fn opt_str<'a>(args: &'a Value, key: &str) -> Result<Option<&'a str>, ToolError> {
    match args.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.as_str())),
        Some(_) => Err(ToolError::InvalidArguments(format!(
            "`{key}` must be a string"
        ))),
    }
}

impl SpawnAgent {
    fn child_spec(
        &self,
        args: &Value,
        info: &SpawnInfo,
    ) -> Result<agentq_agent::spec::SessionSpec, ToolError> {
        let prompt = opt_str(args, "prompt")?
            .filter(|p| !p.trim().is_empty())
            .ok_or_else(|| ToolError::InvalidArguments("`prompt` is required".into()))?;
        if prompt.len() > self.max_prompt_bytes {
            return Err(ToolError::InvalidArguments(format!(
                "`prompt` is {} bytes; a sub-agent's prompt is at most {} bytes",
                prompt.len(),
                self.max_prompt_bytes
            )));
        }
        let parent = &self.parent.spec;
        let mut spec = agentq_agent::spec::SessionSpec::new(prompt);
        spec.provider = parent.provider.clone();
        spec.base_url = parent.base_url.clone();
        spec.model = opt_str(args, "model")?
            .map(str::to_string)
            .or_else(|| parent.model.clone());
        spec.temperature = parent.temperature;
        spec.max_tokens = parent.max_tokens;
        spec.tool_timeout_secs = parent.tool_timeout_secs;
        spec.approval_timeout_secs = parent.approval_timeout_secs;
        spec.sensitive_tools = parent.sensitive_tools.clone();
        // Where and how often its search may look is the parent's (a child cannot widen
        // a search its parent was held to; without the tool the options do nothing).
        spec.web_search = parent.web_search.clone();
        spec.max_llm_retries = parent.max_llm_retries;
        spec.retry_delay_ms = parent.retry_delay_ms;
        spec.max_repeated_calls = parent.max_repeated_calls;
        spec.warn_repeated_calls = parent.warn_repeated_calls;
        spec.max_iterations = match args.get("max_iterations") {
            None | Some(Value::Null) => parent.max_iterations,
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    ToolError::InvalidArguments(
                        "`max_iterations` must be a positive integer".into(),
                    )
                })?
                .min(parent.max_iterations),
        };
        spec.tools = Some(match args.get("tools") {
            None | Some(Value::Null) => self.parent_tools.clone(),
            Some(Value::Array(items)) => {
                let mut tools = Vec::new();
                for t in items {
                    let name = t.as_str().ok_or_else(|| {
                        ToolError::InvalidArguments("`tools` must be a list of tool names".into())
                    })?;
                    if !self.parent_tools.iter().any(|p| p == name) {
                        return Err(ToolError::InvalidArguments(format!(
                            "tool `{name}` is not available to this agent, so not to its children"
                        )));
                    }
                    tools.push(name.to_string());
                }
                tools
            }
            Some(_) => {
                return Err(ToolError::InvalidArguments(
                    "`tools` must be a list of tool names".into(),
                ));
            }
        });
        // The token budget is drawn from the parent's remaining budget by the store, in
        // the spawn's transaction (`spawn_session`); the deadline is what is left of the
        // parent's.
        spec.token_budget = None;
        if let Some(secs) = parent.timeout_secs {
            let elapsed = chrono::Utc::now()
                .signed_duration_since(self.parent.created_at)
                .num_seconds()
                .max(0) as u64;
            spec.timeout_secs = Some(secs.saturating_sub(elapsed).max(1));
        }
        spec.metadata = json!({ "agentq": info });
        Ok(spec)
    }

    /// The child's answer as this call's result.
    fn answer(child: &SessionRow) -> ToolOutput {
        match child.status {
            SessionStatus::Completed => ToolOutput::ok(child.result.clone().unwrap_or_default()),
            status => ToolOutput::error(format!(
                "Sub-agent {} ended {status} ({}): {}",
                child.id,
                child
                    .finish_reason
                    .map(|r| r.as_str().to_string())
                    .unwrap_or_default(),
                child.error.clone().unwrap_or_default()
            )),
        }
    }
}

/// What one call asks for besides the child's spec.
struct Request {
    /// Suspend the parent until the child finishes (else its result is injected later).
    wait: bool,
    /// Tokens for the child, drawn from the parent's remaining budget.
    requested: Option<u64>,
    label: String,
}

impl Request {
    fn parse(args: &Value) -> Result<Self, ToolError> {
        if args.get("_raw").is_some() {
            return Err(ToolError::InvalidArguments(
                "the arguments were not valid JSON".into(),
            ));
        }
        let wait = match args.get("wait") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ToolError::InvalidArguments(
                    "`wait` must be a boolean".into(),
                ));
            }
        };
        let requested = match args.get("token_budget") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().filter(|n| *n >= 1).ok_or_else(|| {
                ToolError::InvalidArguments("`token_budget` must be a positive integer".into())
            })?),
        };
        let label = opt_str(args, "label")?
            .map(str::to_string)
            .unwrap_or_else(|| "sub-agent".to_string());
        Ok(Request {
            wait,
            requested,
            label,
        })
    }
}

fn start_failed(e: agentq_core::Error) -> ToolError {
    ToolError::Failed(format!("cannot start the sub-agent: {e}"))
}

impl SpawnAgent {
    /// The child this call started, found again if it ran before (the call is keyed by
    /// its id), else created. Parallel calls of one response check the child limit and
    /// create under [`SpawnAgent::creating`], so the limit holds however many arrive at
    /// once.
    async fn find_or_create(
        &self,
        args: &Value,
        request: &Request,
        info: &SpawnInfo,
        depth: u32,
        ctx: &ToolContext,
    ) -> Result<SessionRow, ToolError> {
        let _creating = self.creating.lock().await;
        let children = self
            .store
            .list(&ListFilter {
                parent_id: Some(self.parent.id.clone()),
                limit: 10_000,
                ..Default::default()
            })
            .await
            .map_err(start_failed)?;
        let existing = children
            .iter()
            .find(|c| SpawnInfo::of(&c.spec).is_some_and(|i| i.tool_call_id == ctx.tool_call_id))
            .cloned();
        if let Some(child) = existing {
            return Ok(child);
        }
        if children.len() >= self.max_children {
            return Err(ToolError::Denied(format!(
                "this agent already started {} sub-agents, the most allowed",
                self.max_children
            )));
        }
        let mut spec = self.child_spec(args, info)?;
        self.policy
            .for_tenant(&self.tenant)
            .apply(&mut spec, Sent::Stored, SpawnContext { depth })
            .map_err(|v| ToolError::Denied(format!("refused by policy: {v}")))?;
        let new = self.new_child(spec, depth, ctx);
        let (row, created) = self.spawn(&new, request.requested).await?;
        if created {
            self.started(&row, request.wait).await;
        }
        Ok(row)
    }

    /// The child's row to create, in the parent's tree, queue and tenant.
    fn new_child(
        &self,
        spec: agentq_agent::spec::SessionSpec,
        depth: u32,
        ctx: &ToolContext,
    ) -> NewSession {
        NewSession {
            // In its root's partition: a tree lives on one shard.
            id: agentq_core::shard::id_beside(&self.parent.root_id),
            spec,
            queue: self.parent.queue.clone(),
            parent_id: Some(self.parent.id.clone()),
            root_id: self.parent.root_id.clone(),
            depth,
            idempotency_key: Some(format!("spawn:{}", ctx.idempotency_key)),
            idempotency_hash: None,
            // A child acts for its parent's caller: it must not leave the tenant.
            tenant: self.parent.tenant.clone(),
            files: Vec::new(),
            workspace_from: None,
            // A child runs for a tree that was admitted already, at its parent's
            // priority: it enters its queue at once, unless the tree is under a
            // cap on running sessions, which holds for its sub-agents too (the
            // dispatcher hands it out when the cap allows; a parent waiting
            // for it runs nowhere, so the cap cannot starve it).
            sched: agentq_core::scheduling::Placement {
                priority: self.parent.priority,
                held: self.parent.capped,
                capped: self.parent.capped,
                ..Default::default()
            },
        }
    }

    /// Create `new` in the store under the tree's limits; the row, and whether this call
    /// created it (else an earlier run of the call did).
    async fn spawn(
        &self,
        new: &NewSession,
        requested: Option<u64>,
    ) -> Result<(SessionRow, bool), ToolError> {
        let limits = SpawnLimits {
            max_tree_sessions: self.max_tree_sessions,
            budget: self.parent.spec.token_budget.map(|b| SpawnBudget {
                parent_allowance: b,
                requested,
                parent_spent: self.parent_spent.load(Ordering::Relaxed),
            }),
        };
        match self
            .store
            .spawn_session(new, &limits)
            .await
            .map_err(start_failed)?
        {
            Spawned::Created(row) => Ok((row, true)),
            Spawned::Existing(row) => Ok((row, false)),
            Spawned::TreeFull { max } => Err(ToolError::Denied(format!(
                "this session tree already holds {max} sessions, the most \
                 allowed (policy.max_tree_sessions)"
            ))),
            Spawned::NoBudget { remaining } => Err(ToolError::Denied(format!(
                "no token budget left to give a sub-agent ({remaining} tokens \
                 remain of this agent's budget)"
            ))),
        }
    }

    /// A child this call created: counted among the parent's background children when it
    /// is not waited for, and put on its queue.
    async fn started(&self, row: &SessionRow, wait: bool) {
        if !wait {
            self.inbox.child_started();
        }
        // A held one is the dispatcher's to add.
        if !row.held {
            agentq_core::lifecycle::enqueue_one(
                self.store.as_ref(),
                self.queue.as_ref(),
                &row.id,
                &row.queue,
                EnqueueReason::New,
            )
            .await;
        }
    }
}

#[async_trait]
impl Tool for SpawnAgent {
    fn name(&self) -> &str {
        NAME
    }

    fn description(&self) -> &str {
        "Start a sub-agent on a self-contained task. With wait=true (default) you get its \
         final answer as this call's result; with wait=false it runs in the background and \
         its result is delivered to you when it finishes, so you can start several at once."
    }

    fn parameters(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "The task, with everything the sub-agent needs to know."},
                "label": {"type": "string", "description": "A short name for the sub-agent."},
                "model": {"type": "string"},
                "tools": {"type": "array", "items": {"type": "string"}, "description": "Tools it may use (a subset of yours)."},
                "max_iterations": {"type": "integer", "minimum": 1},
                "token_budget": {"type": "integer", "minimum": 1, "description": "Tokens the sub-agent may spend, taken from your own remaining budget until it finishes (default: half of what you have left)."},
                "wait": {"type": "boolean", "default": true}
            },
            "required": ["prompt"],
            "additionalProperties": false
        })
    }

    /// Creating the child is keyed by the call, so running the call again finds it.
    fn side_effect(&self, _args: &Value) -> SideEffect {
        SideEffect::Idempotent
    }

    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<ToolOutput, ToolError> {
        let request = Request::parse(&args)?;
        let info = SpawnInfo {
            label: request.label.clone(),
            wait: request.wait,
            tool_call_id: ctx.tool_call_id.clone(),
        };
        let depth = self.parent.depth.saturating_add(1);
        if depth > self.max_depth {
            return Err(ToolError::Denied(format!(
                "sub-agents may nest {} levels deep; this one would be at depth {depth}",
                self.max_depth
            )));
        }
        let child = self
            .find_or_create(&args, &request, &info, depth, ctx)
            .await?;
        let label = &request.label;
        if !request.wait {
            return Ok(ToolOutput::ok(format!(
                "Started background agent \"{label}\" ({}). Its result will be delivered to you when it finishes; carry on meanwhile.",
                child.id
            )));
        }
        if child.status.is_terminal() {
            return Ok(Self::answer(&child));
        }
        // Not finished: suspend the parent; this call runs again once the child is done.
        Ok(ToolOutput {
            content: format!("waiting for sub-agent \"{label}\" ({})", child.id),
            suspend: true,
            ..Default::default()
        })
    }
}
