//! What every session of the bench asks and is answered: its prompt, the tool each turn
//! but the last calls ([`TRIVIAL`] in process, [`BUILTIN`] in `agentq worker` children)
//! and the text of a turn and of the last one. The fake LLM and the scripted provider say
//! the same, so every part's messages weigh the same. [`spec`] is such a session.

use agentq_agent::spec::SessionSpec;

/// The tool the in-process parts call every iteration unless `--tool` names another: it
/// returns at once and touches nothing, so that the figures are agentq's own costs. It is
/// registered through `WorkerSettings::tools`, as an embedding program's tool would be.
pub const TRIVIAL: &str = "trivial";
/// The tool of the parts that run `agentq worker` children, which have only the built-in
/// tools (and of the in-process parts with `--tool list_dir`): one directory listing through
/// tokio's blocking pool.
pub const BUILTIN: &str = "list_dir";
pub const PROMPT: &str = "Look at the workspace and tell me what is in it.";

/// What a turn says (a realistic, constant size).
pub const TURN_TEXT: &str = "I will look at the workspace to see which files are there before answering; \
     listing the directory is cheap and tells me where the relevant code lives.";
pub const FINAL_TEXT: &str = "The workspace is empty: there are no files to summarise, so there is nothing \
     further to do. Done.";

/// A session of `iterations` turns that may call `tool`.
pub fn spec(iterations: u32, tool: &str) -> SessionSpec {
    let mut spec = SessionSpec::new(PROMPT);
    spec.tools = Some(vec![tool.into()]);
    spec.max_iterations = iterations + 5;
    // The whole history goes to the model (the scripted model picks its turn by counting
    // the assistant turns it is sent).
    spec.history_window = spec.history_window.max(2 * iterations as usize + 10);
    // The scripted model makes the same call every turn by design: the bench measures the
    // system, so no session of it ends `stuck` or carries repeat notes.
    spec.max_repeated_calls = 0;
    spec.warn_repeated_calls = 0;
    spec
}
