//! The examples each command's `--help` ends with (those whose arguments live in their own
//! module keep theirs there): a newcomer finds a command that works before the flags.

pub const DEMO: &str = "Examples:
  agentq demo                                   # 100 sessions, 4 workers, one killed
  agentq demo --sessions 20 --no-kill --json
  OPENAI_API_KEY=sk-... agentq demo --sessions 10 --provider openai --model gpt-4o-mini";

pub const DEV: &str = "Examples:
  OPENAI_API_KEY=sk-... agentq dev              # the API on 127.0.0.1:7700, 2 workers, ./agentq.db
  OPENAI_BASE_URL=http://localhost:8080/v1 OPENAI_API_KEY=none agentq dev --workers 4
  agentq dev --script model.json                # a scripted model (tests, demos)";

pub const RUN: &str = "Examples:
  agentq run \"What is in this directory?\"
  agentq run --provider anthropic --tools read_file,grep \"Where is the config parsed?\"
  agentq run --json --max-iterations 5 \"Summarise README.md\" > events.jsonl";

pub const WORKER: &str = "Examples:
  AGENTQ_DATABASE_URL=postgres://db/agentq AGENTQ_REDIS_URL=redis://redis:6379 \\
    OPENAI_API_KEY=sk-... agentq worker --concurrency 256
  agentq worker --queues bulk --metrics-addr 0.0.0.0:9465   # a second worker on the host";

pub const SCHEDULER: &str = "Examples:
  AGENTQ_ADMIN_KEY=$(openssl rand -hex 32) agentq scheduler
  AGENTQ_API_ADDR=0.0.0.0:7700 agentq scheduler --metrics-addr 0.0.0.0:9464";

pub const MIGRATE: &str = "Examples:
  AGENTQ_DATABASE_URL=postgres://agentq@db/agentq agentq migrate";

pub const KEYS: &str = "Examples:
  agentq keys create --tenant acme --scopes sessions:read,sessions:write --label ci
  agentq keys list
  agentq keys revoke KEY_ID";

pub const RETENTION: &str = "Examples:
  AGENTQ_RETENTION_DAYS=90 agentq retention --dry-run   # what would go, per tenant and queue
  agentq retention --dry-run --at 2027-03-01T00:00:00Z  # what would go on that date
  agentq retention                              # one pass now (the scheduler runs them too)";

pub const STATUS: &str = "Examples:
  agentq status ID                              # the session as JSON; held calls on stderr
  agentq status ID | jq -r .result";

pub const WATCH: &str = "Examples:
  agentq watch ID                               # replayed from the start, then live";

pub const APPROVE: &str = "Examples:
  agentq approve ID                             # the one call the session holds
  agentq approve ID CALL_ID --reason \"looks right\"
  agentq approve ID CALL_ID --arguments '{\"path\": \"out/report.md\"}'   # run it with these";

pub const DENY: &str = "Examples:
  agentq deny ID CALL_ID --reason \"do not write outside out/\"";

pub const SEND: &str = "Examples:
  agentq send ID \"Only the failing tests, please\"        # injected at its next step
  agentq send ID \"Now write the summary\" --strategy enqueue";

pub const FILES: &str = "Examples:
  agentq files ID                               # list: size, sha256, seq, path
  agentq files ID out/summary.md                # one file to stdout
  agentq files ID -o ./results                  # every file, unpacked";

pub const BENCH: &str = "Examples:
  agentq bench --only throughput --sessions 200 --iterations 10
  agentq bench --only ceiling,throughput --baseline ./agentq-main --pairs 6
  agentq bench --private --only throughput --tool mcp --mcp-pairs 3";

pub const BENCH_MCP_SERVER: &str = "Examples:
  agentq bench --private --only throughput --tool mcp   (starts it, once per worker)
  agentq bench-mcp-server --served /tmp/served          (speaks MCP on stdin/stdout)";
