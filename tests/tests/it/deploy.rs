#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The deployment files (deploy/) are valid and agree with the code. No service is
//! started: this checks files.
//! - `docker compose config -q` (or `docker-compose`) accepts deploy/docker-compose.yml
//!   when a compose CLI is installed (skipped with a note otherwise), and the files it
//!   mounts exist;
//! - every Kubernetes manifest parses (with PyYAML when `python3` has it, else a line check)
//!   and holds the expected kinds at current API versions;
//! - the PrometheusRule is deploy/prometheus/alerts.yml, regenerated;
//! - the agentq.toml of the ConfigMap is a valid configuration, the KEDA trigger names
//!   the real stream and consumer group, and every environment variable the manifests
//!   set is one agentq reads;
//! - the Dockerfile copies paths that exist, every workspace member's manifest included.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use agentq_testkit::{repo_root, rust_files};

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo_root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The compose CLI: the `docker compose` plugin, else the standalone `docker-compose`.
fn compose_cli() -> Option<Vec<&'static str>> {
    if succeeds("docker", &["compose", "version"]) {
        Some(vec!["docker", "compose"])
    } else if succeeds("docker-compose", &["version"]) {
        Some(vec!["docker-compose"])
    } else {
        None
    }
}

#[test]
fn compose_file_is_valid() {
    let file = repo_root().join("deploy/docker-compose.yml");
    match compose_cli() {
        Some(cli) => {
            let out = Command::new(cli[0])
                .args(&cli[1..])
                .arg("-f")
                .arg(&file)
                .args(["config", "-q"])
                .current_dir(repo_root())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{} config -q rejected deploy/docker-compose.yml: {}{}",
                cli.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        None => eprintln!(
            "note: no compose CLI (`docker compose` or `docker-compose`): \
             deploy/docker-compose.yml checked by the text checks only"
        ),
    }

    let text = read("deploy/docker-compose.yml");
    for needle in [
        "image: postgres:16",
        "image: redis:7",
        r#""--appendonly", "yes", "--appendfsync", "everysec""#,
        "condition: service_completed_successfully",
        "condition: service_healthy",
        "replicas: 2",
        "/readyz",
        "/healthz",
        r#"command: ["migrate"]"#,
        r#"command: ["scheduler"]"#,
        r#"command: ["worker"]"#,
        "dockerfile: deploy/Dockerfile",
    ] {
        assert!(text.contains(needle), "docker-compose.yml lacks {needle:?}");
    }
    // Every file or directory mounted from the repository exists (paths are relative to
    // the compose file).
    let mut mounts = 0;
    for line in text.lines() {
        if let Some(rest) = line.trim().strip_prefix("- ./") {
            let host = rest.split(':').next().unwrap();
            let path = repo_root().join("deploy").join(host);
            assert!(path.exists(), "docker-compose.yml mounts missing {path:?}");
            mounts += 1;
        }
    }
    assert!(mounts >= 5, "expected the Prometheus and Grafana mounts");
    // The compose Prometheus config keeps the job names the alerts and dashboard use.
    let prom = read("deploy/prometheus/prometheus.compose.yml");
    for job in ["job_name: agentq-scheduler", "job_name: agentq-worker"] {
        assert!(prom.contains(job), "prometheus.compose.yml lacks {job}");
    }
    assert!(prom.contains("- alerts.yml"));
}

/// The example stack is secured as the Kubernetes one is: no service runs with a default
/// password, Redis demands one, and nothing but the API is published beyond loopback.
#[test]
fn compose_stack_has_no_default_password_and_publishes_only_the_api() {
    let text = read("deploy/docker-compose.yml");
    // `${VAR:-default}` would start the stack with a password anyone can read here;
    // `${VAR:?message}` refuses to start without one.
    for var in [
        "POSTGRES_PASSWORD",
        "REDIS_PASSWORD",
        "GRAFANA_ADMIN_PASSWORD",
    ] {
        assert!(
            !text.contains(&format!("${{{var}:-")),
            "docker-compose.yml gives {var} a default"
        );
        assert!(
            text.contains(&format!("${{{var}:?")),
            "docker-compose.yml does not require {var}"
        );
    }
    assert!(
        !text.contains("admin}"),
        "a default Grafana password is back"
    );
    assert!(
        text.contains(r#""redis-server", "--requirepass", "${REDIS_PASSWORD:?"#),
        "Redis runs without a password"
    );
    assert!(
        text.contains("AGENTQ_REDIS_URL: redis://:${REDIS_PASSWORD:?"),
        "agentq does not authenticate to Redis"
    );
    // Every published port: only the API's may listen on every interface.
    let mut published = Vec::new();
    let mut in_ports = false;
    for line in text.lines() {
        let t = line.trim();
        if t == "ports:" {
            in_ports = true;
            continue;
        }
        if in_ports {
            match t.strip_prefix("- ") {
                Some(p) => published.push(p.trim_matches('"').to_string()),
                None if t.starts_with('#') => {}
                None => in_ports = false,
            }
        }
    }
    assert_eq!(published.len(), 3, "{published:?}");
    for p in &published {
        assert!(
            p.starts_with("127.0.0.1:") || p.starts_with("${AGENTQ_API_PORT"),
            "{p} is published on every interface"
        );
    }
}

/// (file, apiVersion, kind, name) of every document of every manifest in deploy/k8s.
fn k8s_documents() -> Vec<(String, String, String, String)> {
    let dir = repo_root().join("deploy/k8s");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {dir:?}");

    if succeeds("python3", &["-c", "import yaml"]) {
        const SCRIPT: &str = r#"
import json, sys, yaml
out = []
for path in sys.argv[1:]:
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            if doc is None:
                continue
            assert isinstance(doc, dict), f"{path}: a document is not a mapping"
            out.append([path, doc.get("apiVersion", ""), doc.get("kind", ""),
                        (doc.get("metadata") or {}).get("name", "")])
print(json.dumps(out))
"#;
        let out = Command::new("python3")
            .arg("-c")
            .arg(SCRIPT)
            .args(&files)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "a manifest does not parse as YAML: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let docs: Vec<Vec<String>> = serde_json::from_slice(&out.stdout).unwrap();
        return docs
            .into_iter()
            .map(|d| {
                let file = Path::new(&d[0]).file_name().unwrap().to_string_lossy();
                (file.into_owned(), d[1].clone(), d[2].clone(), d[3].clone())
            })
            .collect();
    }

    eprintln!("note: python3 with PyYAML not found: manifests checked line by line");
    let mut docs = Vec::new();
    for path in &files {
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(path).unwrap();
        assert!(
            !text.contains('\t'),
            "{file}: tabs are not YAML indentation"
        );
        for doc in text.split("\n---\n") {
            let top = |key: &str| {
                doc.lines()
                    .find_map(|l| l.strip_prefix(key))
                    .map(|v| v.trim().to_string())
            };
            if doc
                .lines()
                .all(|l| l.trim().is_empty() || l.starts_with('#'))
            {
                continue;
            }
            let api = top("apiVersion:").unwrap_or_default();
            let kind = top("kind:").unwrap_or_default();
            // metadata.name: the first `  name:` after `metadata:`.
            let name = doc
                .lines()
                .skip_while(|l| !l.starts_with("metadata:"))
                .find_map(|l| l.strip_prefix("  name:"))
                .map(|v| v.trim().to_string())
                .unwrap_or_default();
            docs.push((file.clone(), api, kind, name));
        }
    }
    docs
}

#[test]
fn k8s_manifests_parse_and_hold_the_expected_kinds() {
    let docs = k8s_documents();
    for (file, api, kind, name) in &docs {
        assert!(
            !api.is_empty() && !kind.is_empty() && !name.is_empty(),
            "{file}: a document without apiVersion, kind or metadata.name"
        );
    }
    let got: BTreeSet<(String, String, String)> = docs
        .iter()
        .map(|(f, a, k, _)| (f.clone(), a.clone(), k.clone()))
        .collect();
    let expected: BTreeSet<(String, String, String)> = [
        ("config.yaml", "v1", "ConfigMap"),
        ("config.yaml", "v1", "Secret"),
        ("keda.yaml", "keda.sh/v1alpha1", "ScaledObject"),
        ("keda.yaml", "keda.sh/v1alpha1", "TriggerAuthentication"),
        ("migrate-job.yaml", "batch/v1", "Job"),
        (
            "networkpolicy.yaml",
            "networking.k8s.io/v1",
            "NetworkPolicy",
        ),
        (
            "prometheusrule.yaml",
            "monitoring.coreos.com/v1",
            "PrometheusRule",
        ),
        ("scheduler.yaml", "apps/v1", "Deployment"),
        ("scheduler.yaml", "policy/v1", "PodDisruptionBudget"),
        ("scheduler.yaml", "v1", "Service"),
        (
            "servicemonitor.yaml",
            "monitoring.coreos.com/v1",
            "PodMonitor",
        ),
        (
            "servicemonitor.yaml",
            "monitoring.coreos.com/v1",
            "ServiceMonitor",
        ),
        ("worker.yaml", "apps/v1", "Deployment"),
    ]
    .into_iter()
    .map(|(f, a, k)| (f.to_string(), a.to_string(), k.to_string()))
    .collect();
    assert_eq!(got, expected);
    // Manifests are namespace-agnostic: `kubectl -n <ns> apply` decides.
    for entry in std::fs::read_dir(repo_root().join("deploy/k8s")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text
                .lines()
                .any(|l| l.trim_start().starts_with("namespace:")),
            "{path:?} pins a namespace"
        );
    }
}

#[test]
fn k8s_manifests_agree_with_the_code() {
    // KEDA reads the lag of the real stream and consumer group.
    let keda = read("deploy/k8s/keda.yaml");
    let stream = agentq_core::queue::queue_stream("default");
    assert!(keda.contains(&format!("stream: {stream}")), "{stream}");
    assert!(
        keda.contains(&format!("consumerGroup: {}", agentq_core::queue::GROUP)),
        "consumer group"
    );
    for needle in [
        "lagCount:",
        "activationLagCount:",
        "minReplicaCount:",
        "maxReplicaCount:",
    ] {
        assert!(keda.contains(needle), "keda.yaml lacks {needle}");
    }

    // The ConfigMap's agentq.toml is a configuration agentq accepts.
    let config = read("deploy/k8s/config.yaml");
    let mut toml = String::new();
    let mut lines = config.lines().skip_while(|l| l.trim() != "agentq.toml: |");
    assert!(lines.next().is_some(), "config.yaml has no agentq.toml");
    for line in lines {
        if !line.is_empty() && !line.starts_with("    ") {
            break;
        }
        toml.push_str(line.strip_prefix("    ").unwrap_or(line));
        toml.push('\n');
    }
    let cfg = agentq_core::config::Settings::from_toml(&toml)
        .unwrap_or_else(|e| panic!("agentq.toml of config.yaml: {e}\n{toml}"));
    // Every queue the workers read has its consumer group created by the scheduler (KEDA
    // needs the group) and a KEDA trigger.
    for q in &cfg.worker.queues {
        assert!(
            cfg.scheduler.queues.contains(q),
            "queue {q} not in [scheduler]"
        );
        let stream = agentq_core::queue::queue_stream(q);
        assert!(
            keda.contains(&format!("stream: {stream}")),
            "no trigger on {stream}"
        );
    }

    // The worker reads that file, and its grace period outlasts its drain timeout.
    let worker = read("deploy/k8s/worker.yaml");
    assert!(worker.contains("--config=/etc/agentq/agentq.toml"));
    let grace: u64 = worker
        .lines()
        .find_map(|l| l.trim().strip_prefix("terminationGracePeriodSeconds:"))
        .expect("terminationGracePeriodSeconds")
        .trim()
        .parse()
        .unwrap();
    let drain = cfg.worker.drain_timeout_secs;
    assert!(grace > drain, "grace {grace}s must exceed drain {drain}s");
    // The scheduler and the migration read it through AGENTQ_CONFIG.
    for file in ["deploy/k8s/scheduler.yaml", "deploy/k8s/migrate-job.yaml"] {
        assert!(read(file).contains("/etc/agentq/agentq.toml"), "{file}");
    }

    // Every environment variable the deployment files name is one agentq reads: the string
    // literals of the CLI, the config module and the provider factory.
    let mut known: BTreeSet<String> = BTreeSet::new();
    let mut sources = vec![
        "types/src/config.rs".to_string(),
        "agent/src/provider/factory.rs".to_string(),
    ];
    for dir in ["types/src/config", "cli/src"] {
        for path in rust_files(&repo_root().join(dir)) {
            let rel = path.strip_prefix(repo_root()).unwrap();
            sources.push(rel.to_string_lossy().into_owned());
        }
    }
    for src in &sources {
        // Every piece between two quotes, wherever it lies: only string literals are
        // all capitals and underscores.
        for piece in read(src).split('"') {
            if !piece.is_empty() && piece.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
                known.insert(piece.to_string());
            }
        }
    }
    let mut files = vec!["deploy/docker-compose.yml".to_string()];
    for entry in std::fs::read_dir(repo_root().join("deploy/k8s")).unwrap() {
        let path = entry.unwrap().path();
        files.push(format!(
            "deploy/k8s/{}",
            path.file_name().unwrap().to_string_lossy()
        ));
    }
    let mut checked = 0;
    for file in &files {
        let text = read(file);
        for token in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            let ours = ["AGENTQ_", "OPENAI_", "ANTHROPIC_"]
                .iter()
                .any(|p| token.starts_with(p) && token.len() > p.len());
            // Compose-only knobs of the compose file itself, not read by agentq.
            let compose_own = ["AGENTQ_API_PORT"].contains(&token);
            if ours && !compose_own {
                assert!(
                    known.contains(token),
                    "{file} names {token}, which agentq does not read"
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked > 20,
        "expected environment variables in the manifests"
    );
}

#[test]
fn prometheusrule_is_the_alert_rules() {
    // prometheusrule.yaml = its header up to `spec:`, then alerts.yml without its leading
    // comments, indented by two spaces (the command is in its header).
    let rule = read("deploy/k8s/prometheusrule.yaml");
    let (_, body) = rule
        .split_once("\nspec:\n")
        .expect("prometheusrule.yaml has no `spec:` line");
    let alerts = read("deploy/prometheus/alerts.yml");
    let mut expected = String::new();
    let mut header = true;
    for line in alerts.lines() {
        if header && line.starts_with('#') {
            continue;
        }
        header = false;
        if !line.is_empty() {
            expected.push_str("  ");
        }
        expected.push_str(line);
        expected.push('\n');
    }
    assert!(
        body == expected,
        "deploy/k8s/prometheusrule.yaml is out of date with deploy/prometheus/alerts.yml: \
         regenerate it with the command in its header"
    );
}

#[test]
fn dockerfile_copies_what_exists() {
    let text = read("deploy/Dockerfile");
    for needle in [
        "FROM rust:1-bookworm AS builder",
        "FROM debian:bookworm-slim",
        "ca-certificates",
        r#"ENTRYPOINT ["agentq"]"#,
        r#"CMD ["worker"]"#,
        "EXPOSE 7700 9464",
        "USER 10001",
        "--locked",
    ] {
        assert!(text.contains(needle), "Dockerfile lacks {needle:?}");
    }
    let mut copied = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("COPY ") else {
            continue;
        };
        if rest.starts_with("--from") {
            continue;
        }
        let parts: Vec<&str> = rest.split_whitespace().collect();
        for src in &parts[..parts.len() - 1] {
            assert!(
                repo_root().join(src).exists(),
                "Dockerfile copies {src}, which does not exist"
            );
            copied.insert(src.to_string());
        }
    }
    // The dependency layer needs every workspace member's manifest.
    let cargo = read("Cargo.toml");
    let members = cargo
        .lines()
        .find_map(|l| l.strip_prefix("members = "))
        .expect("workspace members");
    let members: Vec<&str> = members
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .collect();
    assert!(members.len() >= 5, "{members:?}");
    for m in members {
        let manifest = format!("{m}/Cargo.toml");
        assert!(
            copied.contains(&manifest),
            "Dockerfile does not copy {manifest}"
        );
    }
    let ignore = read(".dockerignore");
    for needle in ["target/", ".git/", "*.db"] {
        assert!(
            ignore.lines().any(|l| l == needle),
            ".dockerignore lacks {needle}"
        );
    }
}
