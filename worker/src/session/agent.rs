//! Building a run's agent from the session's admitted spec and this worker's settings:
//! its provider and default model, the tools it may use (with `spawn_agent` bound to this
//! session, and the MCP tools it names from this worker's servers), the guard pipeline
//! under its tenant's policy and the operator's guards, and the admission its LLM calls
//! pass.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use agentq_agent::driver::{Agent, Interrupter};
use agentq_agent::guard::{Firewall, Guards, Permissions};
use agentq_agent::provider::{LlmProvider, factory};
use agentq_agent::spec::{SessionSpec, WEB_SEARCH_TOOL, WebSearch};
use agentq_agent::tools::{LocalWorkspace, ToolRegistry};
use agentq_core::SessionRow;
use agentq_core::config::MCP_TOOL_PREFIX;
use agentq_core::policy::TenantPolicy;

use crate::admission::admission_for;
use crate::checkpoint::StoreCheckpointer;
use crate::inbox::SessionInbox;
use crate::inner::Inner;
use crate::observe::{SessionObserver, StreamSink};
use crate::spawn::{self, SpawnAgent};
use crate::tenant::tenant;

/// What a run's agent is made of besides the session's spec.
pub(super) struct AgentParts {
    pub(super) checkpointer: Arc<StoreCheckpointer>,
    pub(super) observer: Arc<SessionObserver>,
    pub(super) sink: Arc<StreamSink>,
    pub(super) inbox: Arc<SessionInbox>,
    pub(super) interrupter: Arc<Interrupter>,
    pub(super) workspace: LocalWorkspace,
}

/// The agent that runs `spec` (admitted already) for `row`; why not, when its provider or
/// one of its tools cannot be had.
pub(super) fn build_agent(
    inner: &Arc<Inner>,
    row: &SessionRow,
    spec: &SessionSpec,
    parts: AgentParts,
) -> Result<Agent, String> {
    let policy = inner.cfg.policy.for_tenant(tenant(row));
    let provider_name = provider_of(inner, spec)?;
    let provider = inner
        .provider(tenant(row), &provider_name, spec.base_url.as_deref())
        .map_err(|e| format!("provider: {e}"))?;
    let default_model = inner
        .cfg
        .default_model
        .clone()
        .unwrap_or_else(|| factory::default_model(&provider_name).to_string());
    let wanted = spec
        .tools
        .clone()
        .unwrap_or_else(|| inner.cfg.default_tools.clone());
    let web_search = web_search_of(spec, &wanted, &provider_name, &*provider)?;
    // MCP tools (exact names and globs) come from this worker's servers; a server it
    // lacks gives tools whose calls say so, rather than a session that cannot start.
    // The web search is the provider's: no local tool stands in for it.
    let (mcp_names, builtin): (Vec<String>, Vec<String>) = wanted
        .iter()
        .filter(|t| t.as_str() != spawn::NAME && t.as_str() != WEB_SEARCH_TOOL)
        .cloned()
        .partition(|t| t.starts_with(MCP_TOOL_PREFIX));
    let mut tools = inner
        .tools()
        .select(&builtin)
        .map_err(|e| format!("tools: {e}"))?;
    let mcp = inner.mcp().select(&mcp_names);
    tools.extend(&mcp.registry);
    let admissions = admission_for(inner, row, spec.token_budget, &*provider);
    if wanted.iter().any(|t| t == spawn::NAME) {
        let child_of = Parent {
            row,
            spec,
            tools: &wanted,
            inbox: &parts.inbox,
            spent: &admissions.spent,
        };
        tools.register(Arc::new(spawn_tool(inner, policy, child_of)));
    }
    // The tree's directory is made when a tool first writes there (or when committed
    // files are restored into it): sessions that never touch files cost no directory
    // (creating one per session was a fifth of a worker's CPU in the bench, and a
    // blocking call on the runtime).
    let workspace = parts.workspace;
    let mut guards = guards_for(inner, row, policy, &tools, &parts.inbox);
    guards.sensitive_tools.extend(mcp.sensitive);
    if web_search.is_some() {
        // A call of the search's name in the model's own tool calls is not the
        // provider's search: it is answered, never run.
        guards.native_tools.insert(WEB_SEARCH_TOOL.to_string());
    }
    guards.guardian_admission = admissions.guardian;
    Ok(Agent {
        provider,
        default_model,
        tools,
        web_search,
        guards,
        events: parts.sink,
        checkpointer: parts.checkpointer,
        background: parts.inbox,
        workspace: Arc::new(workspace),
        settings: Arc::new(inner.cfg.tool_settings.clone()),
        observer: parts.observer,
        interrupter: parts.interrupter,
        admission: admissions.session,
        write_ahead_grace: inner.cfg.write_ahead_grace,
        max_llm_retries: inner.cfg.max_llm_retries,
        suspend_after: inner.cfg.rate_limit_suspend_after,
    })
}

/// The web search `spec` runs with: its options when its tools (`wanted`, its own or this
/// worker's defaults, already held to its tenant's policy) name it, on a provider that
/// runs it; a session asking for it of one that cannot fails, naming the tool, rather
/// than run without it.
fn web_search_of(
    spec: &SessionSpec,
    wanted: &[String],
    provider_name: &str,
    provider: &dyn LlmProvider,
) -> Result<Option<WebSearch>, String> {
    let Some(i) = wanted.iter().position(|t| t == WEB_SEARCH_TOOL) else {
        return Ok(None);
    };
    if !provider.web_search() {
        let field = match spec.tools {
            Some(_) => format!("tools[{i}]"),
            None => "worker.default_tools".to_string(),
        };
        return Err(format!(
            "{field}: `{WEB_SEARCH_TOOL}` is a search the provider runs itself, and provider \
             `{provider_name}` cannot (anthropic can)"
        ));
    }
    Ok(Some(spec.web_search_options()))
}

/// The provider `spec` runs on: its own, else this worker's default; with neither, why
/// not and how to configure one (a made-up answer is worse than none).
pub(super) fn provider_of(inner: &Inner, spec: &SessionSpec) -> Result<String, String> {
    spec.provider
        .clone()
        .or_else(|| inner.cfg.default_provider.clone())
        .ok_or_else(|| agentq_core::config::NO_MODEL.to_string())
}

/// The session whose run may start sub-agents, as its `spawn_agent` tool sees it.
struct Parent<'a> {
    row: &'a SessionRow,
    /// Its spec as admitted here (what its children's specs are drawn from).
    spec: &'a SessionSpec,
    /// The tools it asked for: a child gets these or fewer.
    tools: &'a [String],
    inbox: &'a Arc<SessionInbox>,
    /// What its calls have spent as this run knows it.
    spent: &'a Arc<AtomicU64>,
}

/// `spawn_agent` for `parent`, under the lower of this worker's limits and its tenant's
/// policy.
fn spawn_tool(inner: &Arc<Inner>, policy: &TenantPolicy, parent: Parent<'_>) -> SpawnAgent {
    SpawnAgent {
        store: inner.store.clone(),
        queue: inner.queue.clone(),
        parent: SessionRow {
            spec: parent.spec.clone(),
            ..parent.row.clone()
        },
        parent_tools: parent.tools.to_vec(),
        max_depth: policy.max_depth(inner.cfg.max_depth),
        max_children: policy.max_children(inner.cfg.max_children),
        max_prompt_bytes: inner.cfg.max_prompt_bytes,
        max_tree_sessions: policy.max_tree_sessions(),
        policy: inner.cfg.policy.clone(),
        tenant: tenant(parent.row).to_string(),
        inbox: parent.inbox.clone(),
        parent_spent: parent.spent.clone(),
        creating: tokio::sync::Mutex::new(()),
    }
}

/// The guard pipeline of `row`'s run: the firewall, approvals through its inbox, the
/// tools its tenant may use, then the operator's own guards.
fn guards_for(
    inner: &Arc<Inner>,
    row: &SessionRow,
    policy: &TenantPolicy,
    tools: &ToolRegistry,
    inbox: &Arc<SessionInbox>,
) -> Guards {
    // The permission stage holds the tenant's rule, so a call of anything else is denied
    // even if it reaches the pipeline.
    let allowed = tools
        .names()
        .into_iter()
        .filter(|n| policy.allows_tool(n))
        .collect();
    let mut guards = Guards {
        tenant: tenant(row).to_string(),
        firewall: Some(Firewall::shared()),
        sensitive_tools: inner.cfg.sensitive_tools.iter().cloned().collect(),
        approver: Some(inbox.clone()),
        permissions: Permissions {
            can_use_tools: true,
            allowed: Some(allowed),
        },
        ..Guards::default()
    };
    inner.cfg.operator.apply(&mut guards);
    guards
}
