//! `agentq run`: one session in this process, streamed to the terminal. No store, no queue.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Args;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use agentq_agent::driver::{Agent, NoBackground, NoCheckpoint, RunEnd};
use agentq_agent::event::AgentEvent;
use agentq_agent::guard::{Firewall, Guards};
use agentq_agent::provider::LlmProvider;
use agentq_agent::provider::factory::{self, ProviderSettings};
use agentq_agent::spec::{ExitReason, Mode, SessionSpec, WEB_SEARCH_TOOL, WebSearch};
use agentq_agent::state::{Outcome, SessionState};
use agentq_agent::tools::{
    LocalWorkspace, READ_ONLY_TOOLS, ToolRegistry, ToolSettings, builtin_registry,
};
use agentq_core::config::Settings;
use agentq_core::hooks::OperatorGuards;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The task for the agent.
    pub prompt: String,
    /// openai, anthropic or scripted (default: scripted with --script, else the provider
    /// the environment configures: OPENAI_API_KEY or OPENAI_BASE_URL, then ANTHROPIC_*).
    #[arg(long)]
    pub provider: Option<String>,
    #[arg(long)]
    pub model: Option<String>,
    /// Endpoint of the provider (OpenAI-compatible servers: vLLM, Ollama, OpenRouter…);
    /// the key from OPENAI_API_KEY or ANTHROPIC_API_KEY is sent to it.
    #[arg(long)]
    pub base_url: Option<String>,
    /// act, think, plan or plan-act.
    #[arg(long, default_value = "act", value_parser = parse_mode)]
    pub mode: Mode,
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_iterations: Option<u32>,
    /// End the session `stuck` when the model makes the same call this many times in a
    /// row with the same result (default 5; 0: never).
    #[arg(long, value_parser = parse_repeat_limit)]
    pub max_repeated_calls: Option<u32>,
    /// Comma-separated tool names (default: the read-only set).
    #[arg(long, value_delimiter = ',')]
    pub tools: Option<Vec<String>>,
    /// Directory the file tools work in.
    #[arg(long, default_value = ".")]
    pub workspace: PathBuf,
    #[arg(long)]
    pub system: Option<String>,
    /// JSON script for the scripted provider (default: a built-in demo script).
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Enable the `shell` tool (it still has to be listed in --tools).
    #[arg(long)]
    pub enable_shell: bool,
    /// Let http_fetch reach private and loopback addresses.
    #[arg(long)]
    pub allow_private_network: bool,
    #[arg(long)]
    pub temperature: Option<f32>,
    #[arg(long)]
    pub max_tokens: Option<u32>,
    /// Print one JSON event per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Configuration file whose [[hooks]] and [guardian] the session runs with (default:
    /// ./agentq.toml when present).
    #[arg(long, env = "AGENTQ_CONFIG")]
    pub config: Option<PathBuf>,
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    s.parse()
}

pub async fn run(mut args: RunArgs) -> anyhow::Result<ExitCode> {
    let tool_settings = ToolSettings {
        shell_enabled: args.enable_shell,
        allow_private_network: args.allow_private_network,
        ..ToolSettings::default()
    };
    let (tools, wanted) = select_tools(&args, &tool_settings)?;
    let (provider, model) = provider_and_model(&mut args)?;
    let web_search = wanted
        .iter()
        .any(|t| t == WEB_SEARCH_TOOL)
        .then(|| {
            if provider.web_search() {
                Ok(WebSearch::default())
            } else {
                Err(anyhow::anyhow!(
                    "--tools: `{WEB_SEARCH_TOOL}` is a search the provider runs itself, and \
                     provider `{}` cannot (use --provider anthropic)",
                    provider.name()
                ))
            }
        })
        .transpose()?;
    let workspace = LocalWorkspace::new(&args.workspace)
        .with_context(|| format!("--workspace: cannot use {}", args.workspace.display()))?;
    let spec = session_spec(&args, &model, wanted)?;

    let mut guards = Guards {
        tenant: "default".to_string(),
        firewall: Some(Arc::new(Firewall::default())),
        ..Guards::default()
    };
    operator_guards(args.config.as_deref())?.apply(&mut guards);
    if web_search.is_some() {
        guards.native_tools.insert(WEB_SEARCH_TOOL.to_string());
    }

    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<AgentEvent>();
    let agent = Agent {
        provider,
        default_model: model,
        tools,
        web_search,
        guards,
        events: Arc::new(tx),
        checkpointer: Arc::new(NoCheckpoint),
        background: Arc::new(NoBackground),
        workspace: Arc::new(workspace),
        settings: Arc::new(tool_settings),
        observer: Arc::new(agentq_agent::observe::NoObserver),
        interrupter: agentq_agent::driver::Interrupter::new(),
        admission: std::sync::Arc::new(agentq_agent::driver::NoAdmission),
        max_llm_retries: agentq_agent::spec::DEFAULT_MAX_LLM_RETRIES,
        // A one-off run has no host to wake it: it waits (bounded by its deadline).
        suspend_after: std::time::Duration::ZERO,
        // Nothing is checkpointed here.
        write_ahead_grace: std::time::Duration::ZERO,
    };
    let cancel = CancellationToken::new();
    let ctrl_c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            ctrl_c.cancel();
        }
    });
    let mut state = SessionState::new(uuid_like(), spec);
    let json = args.json;
    let printer = tokio::spawn(print_events(rx, json));
    let end = agent.run(&mut state, &cancel).await;
    drop(agent);
    let _ = printer.await;
    let outcome = match end {
        Ok(RunEnd::Finished(o)) => o,
        Ok(RunEnd::Suspended(r)) => {
            bail!("the session suspended ({r:?}), which `agentq run` cannot resume")
        }
        Err(e) => bail!("{e}"),
    };
    Ok(exit_code(&outcome, json))
}

/// The provider named by `--provider` (its script, and `--base-url`, applied) and the
/// model the session asks for.
fn provider_and_model(args: &mut RunArgs) -> anyhow::Result<(Arc<dyn LlmProvider>, String)> {
    let mut settings = ProviderSettings::from_env();
    let name = match (&args.provider, &args.script) {
        (Some(p), _) => p.clone(),
        (None, Some(_)) => "scripted".into(),
        (None, None) => {
            match implied_provider(&settings).or(args.base_url.as_ref().map(|_| "openai")) {
                Some(p) => p.into(),
                // A made-up answer is worse than none: the scripted model only when asked.
                None => bail!(
                    "no model configured: set OPENAI_API_KEY (and OPENAI_BASE_URL for another \
                 OpenAI-compatible server) or ANTHROPIC_API_KEY, or pass --provider \
                 (--provider scripted plays a built-in demo script)"
                ),
            }
        }
    };
    args.provider = Some(name.clone());
    if let Some(path) = &args.script {
        let json = std::fs::read_to_string(path)
            .with_context(|| format!("--script: cannot read {}", path.display()))?;
        settings.script = Some(json);
    }
    // `run` acts on the operator's own behalf: the environment's keys are its keys, and
    // `--base-url` is an endpoint the operator chose, like OPENAI_BASE_URL, so the key of
    // the environment goes there.
    if let Some(url) = &args.base_url {
        match name.as_str() {
            "anthropic" => settings.anthropic_base_url = Some(url.clone()),
            _ => settings.openai_base_url = Some(url.clone()),
        }
    }
    let provider =
        factory::build(&name, None, &settings).map_err(|e| anyhow::anyhow!("--provider: {e}"))?;
    let model = args
        .model
        .clone()
        .unwrap_or_else(|| factory::default_model(&name).to_string());
    Ok((provider, model))
}

/// The provider the environment configures, as the workers pick theirs: OpenAI's
/// variables first, then Anthropic's.
fn implied_provider(s: &ProviderSettings) -> Option<&'static str> {
    if s.openai_api_key.is_some() || s.openai_base_url.is_some() {
        Some("openai")
    } else if s.anthropic_api_key.is_some() || s.anthropic_base_url.is_some() {
        Some("anthropic")
    } else {
        None
    }
}

/// The tools of `--tools` (default: the read-only set), and their names as the session
/// lists them.
fn select_tools(
    args: &RunArgs,
    tool_settings: &ToolSettings,
) -> anyhow::Result<(ToolRegistry, Vec<String>)> {
    let all = builtin_registry(tool_settings);
    let wanted: Vec<String> = match &args.tools {
        Some(t) => t
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        None => READ_ONLY_TOOLS.iter().map(|s| s.to_string()).collect(),
    };
    // The web search is the provider's own, not a tool of this registry.
    let local: Vec<String> = wanted
        .iter()
        .filter(|t| *t != WEB_SEARCH_TOOL)
        .cloned()
        .collect();
    let tools = match all.select(&local) {
        Ok(t) => t,
        Err(e) if wanted.iter().any(|t| t == "shell") && !args.enable_shell => {
            bail!("--tools: {e} (the shell tool needs --enable-shell)")
        }
        Err(e) => bail!("--tools: {e}"),
    };
    Ok((tools, wanted))
}

/// `--max-repeated-calls`: 0, or 2 to 100 (the API's bounds: 1 would end a session at
/// its first call).
fn parse_repeat_limit(v: &str) -> Result<u32, String> {
    let max = agentq_core::policy::request::MAX_REPEATED_CALLS;
    match v.parse::<u32>() {
        Ok(n) if n == 0 || (2..=max).contains(&n) => Ok(n),
        _ => Err(format!("expected 0 (never) or 2 to {max}, got {v:?}")),
    }
}

/// The session the flags describe, checked as the API checks one (a refusal names the
/// flag).
fn session_spec(args: &RunArgs, model: &str, tools: Vec<String>) -> anyhow::Result<SessionSpec> {
    let mut spec = SessionSpec::new(args.prompt.clone());
    spec.provider = args.provider.clone();
    spec.model = Some(model.to_string());
    spec.base_url = args.base_url.clone();
    spec.mode = args.mode;
    spec.system = args.system.clone();
    spec.tools = Some(tools);
    if let Some(n) = args.max_iterations {
        spec.max_iterations = n;
    }
    if let Some(n) = args.max_repeated_calls {
        spec.max_repeated_calls = n;
    }
    if let Some(t) = args.temperature {
        spec.temperature = t;
    }
    if let Some(t) = args.max_tokens {
        spec.max_tokens = t;
    }
    if let Err((field, msg)) = spec.validate() {
        bail!("--{}: {msg}", field.replace('_', "-"));
    }
    Ok(spec)
}

/// Print the session's events until the agent drops its sender: one JSON line each with
/// `--json`, else the text on stdout and the tool calls, results and waits on stderr.
async fn print_events(mut rx: UnboundedReceiver<AgentEvent>, json: bool) {
    let mut out = std::io::stdout();
    let mut at_line_start = true;
    while let Some(ev) = rx.recv().await {
        if json {
            if let Ok(line) = serde_json::to_string(&ev) {
                let _ = writeln!(out, "{line}");
            }
            continue;
        }
        match ev {
            AgentEvent::TextDelta { text } => {
                let _ = write!(out, "{text}");
                let _ = out.flush();
                at_line_start = text.ends_with('\n');
            }
            AgentEvent::ToolCall {
                name, arguments, ..
            } => {
                if !at_line_start {
                    let _ = writeln!(out);
                    at_line_start = true;
                }
                let mut args = arguments.to_string();
                if args.len() > 120 {
                    args.truncate(agentq_floor(&args, 117));
                    args.push_str("...");
                }
                eprintln!("  → {name} {args}");
            }
            AgentEvent::ToolResult {
                name,
                content,
                is_error,
                ..
            } => {
                let first = content.lines().next().unwrap_or("");
                let mark = if is_error { "✗" } else { "✓" };
                eprintln!(
                    "  {mark} {name}: {} ({} chars)",
                    shorten(first, 80),
                    content.len()
                );
            }
            AgentEvent::Error {
                message,
                retrying: true,
            } => {
                eprintln!("  ! {message}");
            }
            AgentEvent::RateLimited { wait_ms, reason } => {
                eprintln!("  … rate limit ({reason}): waiting {wait_ms} ms");
            }
            _ => {}
        }
    }
    if !json && !at_line_start {
        let _ = writeln!(out);
    }
}

/// The exit code of a finished session (saying why on stderr unless `--json`): 0 when
/// it stopped, 3 yielded, 130 interrupted, 1 otherwise.
fn exit_code(outcome: &Outcome, json: bool) -> ExitCode {
    if outcome.reason == ExitReason::Stop {
        return ExitCode::SUCCESS;
    }
    if !json {
        let why = outcome.error.clone().unwrap_or_default();
        eprintln!(
            "agentq: session ended with `{}`{}{}",
            outcome.reason,
            if why.is_empty() { "" } else { ": " },
            why
        );
    }
    ExitCode::from(match outcome.reason {
        ExitReason::Stop => 0,
        ExitReason::Yielded => 3,
        ExitReason::Interrupted => 130,
        _ => 1,
    })
}

/// The operator's hooks and guardian from the configuration file, as a worker runs them.
fn operator_guards(config: Option<&std::path::Path>) -> anyhow::Result<OperatorGuards> {
    let settings = Settings::resolve(config, |k| std::env::var(k).ok(), |_| {})
        .map_err(|e| anyhow::anyhow!("--config: {e}"))?;
    OperatorGuards::from_settings(&settings, agentq_core::metrics::global())
        .map_err(|e| anyhow::anyhow!("--config: {e}"))
}

fn agentq_floor(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn shorten(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_string();
    }
    let mut out: String = s.chars().take(n).collect();
    out.push('…');
    out
}

fn uuid_like() -> String {
    agentq_core::new_session_id()
}
