//! `[mcp]`: the file's shape, the values read from the environment, and each rule naming
//! the key it refuses.

use std::path::Path;

use super::env_of;
use crate::config::*;

const TWO: &str = r#"
[[mcp.servers]]
name = "time"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
env = ["TZ", "UNSET_ONE"]
timeout_secs = 5
max_concurrent_calls = 2

[[mcp.servers]]
name = "tickets"
url = "https://mcp.example.internal/mcp"
headers = { Authorization = "TICKETS_MCP_TOKEN" }
destructive_sensitive = true
[mcp.servers.tools.close_ticket]
side_effect = "unsafe"
sensitive = true
"#;

fn load(text: &str, env: &[(&str, &str)]) -> crate::error::Result<Settings> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentq.toml");
    std::fs::write(&path, text).unwrap();
    Settings::load_with(Some(Path::new(&path)), env_of(env))
}

#[test]
fn servers_load_with_their_variables_read_from_the_environment() {
    let c = load(
        TWO,
        &[
            ("TZ", "UTC"),
            ("TICKETS_MCP_TOKEN", "Bearer t0k"),
            ("OPENAI_API_KEY", "sk-never-seen-by-a-server"),
        ],
    )
    .unwrap();
    let [time, tickets] = c.mcp.servers.as_slice() else {
        panic!("two servers: {:?}", c.mcp.servers);
    };
    assert_eq!(time.command.as_deref(), Some("mcp-server-time"));
    assert_eq!(time.timeout_secs, 5);
    assert_eq!(time.max_concurrent_calls, 2);
    assert_eq!(time.max_result_bytes, DEFAULT_MCP_MAX_RESULT_BYTES);
    // Only the listed variables that are set, nothing else of the environment.
    let vars: Vec<(&str, &str)> = time
        .env_values
        .iter()
        .map(|(k, v)| (k.as_str(), v.expose()))
        .collect();
    assert_eq!(vars, [("TZ", "UTC")]);
    assert_eq!(
        tickets
            .header_values
            .get("Authorization")
            .map(Secret::expose),
        Some("Bearer t0k")
    );
    assert_eq!(tickets.timeout_secs, DEFAULT_MCP_TIMEOUT_SECS);
    let close = &tickets.tools["close_ticket"];
    assert_eq!(close.side_effect, Some(SideEffectSetting::Unsafe));
    assert!(close.sensitive && tickets.destructive_sensitive);
    // A dumped configuration holds the variables' names, never their values.
    let dumped = serde_json::to_string(&c).unwrap();
    assert!(!dumped.contains("t0k") && dumped.contains("TICKETS_MCP_TOKEN"));
}

#[test]
fn an_unknown_key_is_refused_naming_it() {
    let e = load(
        "[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\ncomand = \"y\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("comand"), "{e}");
    let e = load(
        "[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\n[mcp.servers.tools.t]\nsensitiv = true\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("sensitiv"), "{e}");
    let e = load(
        "[[mcp.servers]]\nname = \"a\"\ncommand = \"x\"\n[mcp.servers.tools.t]\nside_effect = \"maybe\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("maybe"), "{e}");
}

fn server(name: &str) -> McpServerSettings {
    Settings::from_toml(&format!(
        "[[mcp.servers]]\nname = \"{name}\"\ncommand = \"prog\"\n"
    ))
    .unwrap()
    .mcp
    .servers
    .remove(0)
}

fn refused(tweak: impl FnOnce(&mut McpServerSettings)) -> String {
    let mut s = Settings::default();
    let mut one = server("ok");
    tweak(&mut one);
    s.mcp.servers.push(one);
    s.validate().unwrap_err().to_string()
}

#[test]
fn each_rule_names_the_key_it_refuses() {
    for bad in [
        "",
        "Time",
        "a__b",
        "_a",
        "a_",
        "a.b",
        "a b",
        &"x".repeat(33),
    ] {
        let e = refused(|s| s.name = bad.to_string());
        assert!(e.contains("mcp.servers[0].name"), "{bad}: {e}");
    }
    let e = refused(|s| s.url = Some("https://x/mcp".into()));
    assert!(
        e.contains("mcp.servers[0].url") && e.contains("not both"),
        "{e}"
    );
    let e = refused(|s| s.command = None);
    assert!(
        e.contains("mcp.servers[0]") && e.contains("`command`"),
        "{e}"
    );
    for url in [
        "ftp://x/mcp",
        "file:///etc/passwd",
        "https://user:pw@x/mcp",
        "x",
    ] {
        let e = refused(|s| {
            s.command = None;
            s.url = Some(url.into());
        });
        assert!(e.contains("mcp.servers[0].url"), "{url}: {e}");
    }
    // A header's value is the name of a variable, never a secret written in the file.
    let e = refused(|s| {
        s.command = None;
        s.url = Some("https://x/mcp".into());
        s.headers
            .insert("Authorization".into(), "Bearer sk-123".into());
    });
    assert!(e.contains("mcp.servers[0].headers.Authorization"), "{e}");
    let e = refused(|s| {
        s.headers.insert("Authorization".into(), "TOKEN".into());
    });
    assert!(e.contains("mcp.servers[0].headers"), "{e}");
    let e = refused(|s| s.env.push("NOT A NAME".into()));
    assert!(e.contains("mcp.servers[0].env"), "{e}");
    let e = refused(|s| s.timeout_secs = 0);
    assert!(e.contains("mcp.servers[0].timeout_secs"), "{e}");
    let e = refused(|s| s.max_concurrent_calls = 0);
    assert!(e.contains("mcp.servers[0].max_concurrent_calls"), "{e}");
    let e = refused(|s| s.max_result_bytes = 10);
    assert!(e.contains("mcp.servers[0].max_result_bytes"), "{e}");

    let mut s = Settings::default();
    s.mcp.servers = vec![server("time"), server("time")];
    let e = s.validate().unwrap_err().to_string();
    assert!(
        e.contains("mcp.servers[1].name") && e.contains("two servers"),
        "{e}"
    );
    s.mcp.servers = vec![server("time"), server("my-tickets_2")];
    s.validate().unwrap();
}

#[test]
fn tool_names_carry_their_server() {
    assert_eq!(mcp_tool_name("time", "now"), "mcp__time__now");
    assert_eq!(mcp_server_of("mcp__time__now"), Some("time"));
    assert_eq!(mcp_server_of("mcp__time__*"), Some("time"));
    assert_eq!(mcp_server_of("mcp__my-srv__a__b"), Some("my-srv"));
    assert_eq!(mcp_server_of("read_file"), None);
    assert_eq!(mcp_server_of("mcp____x"), None);
}
