//! The provider keys of a real `agentq dev`, tried as an API caller would: canary keys sit
//! in the process's environment (where operators put them) and its endpoints point at a
//! loopback listener. A session naming its own `base_url` never gets a key sent there, for
//! both providers; a redirect from the configured endpoint is not followed; `shell`
//! running `env` prints none of them; malformed base URLs are a 422 naming `base_url`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;

use std::path::Path;
use std::time::Duration;

use agentq_testkit::{FakeLlm, FakeResponse, fixture};
use serde_json::{Value, json};

use common::{Dev, agentq, create_session, wait_finished};

const OPENAI_CANARY: &str = "sk-canary-e2e-openai-5d1e";
const ANTHROPIC_CANARY: &str = "sk-ant-canary-e2e-77aa";

/// The configuration file the test runs `agentq dev` with: shell enabled and allowed so
/// `env` can be tried, and `allowed_base_urls` allowed as session base URLs (refused by
/// default): an operator allowing an endpoint does not give it the keys.
fn agentq_toml(dir: &Path, allowed_base_urls: &[String]) -> String {
    let quoted: Vec<String> = allowed_base_urls.iter().map(|u| format!("{u:?}")).collect();
    format!(
        "[worker]\nshell_enabled = true\nworkspace_root = {:?}\n\n\
         [policy]\nbase_urls = [{}]\ntools = [\"read_file\", \"list_dir\", \"glob\", \"grep\", \
         \"spawn_agent\", \"shell\"]\n",
        dir.join("ws").display().to_string(),
        quoted.join(", ")
    )
}

/// `agentq dev` on a free loopback port with canary keys in its environment and its
/// provider endpoints at `configured`.
fn start_dev(dir: &Path, configured: &FakeLlm, allowed_base_urls: &[String]) -> Dev {
    let config = dir.join("agentq.toml");
    std::fs::write(&config, agentq_toml(dir, allowed_base_urls)).unwrap();
    let script = dir.join("script.json");
    std::fs::write(
        &script,
        json!({"turns": [
            {"text": "Looking.", "tool_calls": [{"name": "shell", "arguments": {"command": "env"}}]},
            {"text": "Done."},
        ]})
        .to_string(),
    )
    .unwrap();
    Dev::spawn(
        agentq()
            .current_dir(dir)
            .env("OPENAI_API_KEY", OPENAI_CANARY)
            .env("ANTHROPIC_API_KEY", ANTHROPIC_CANARY)
            .env("OPENAI_BASE_URL", format!("{}/v1", configured.url))
            .env("ANTHROPIC_BASE_URL", &configured.url)
            .args(["dev", "--addr", "127.0.0.1:0", "--workers", "1", "--db"])
            .arg(dir.join("dev.db"))
            .arg("--config")
            .arg(&config)
            .arg("--script")
            .arg(&script),
    )
}

async fn finished(http: &reqwest::Client, dev: &Dev, id: &str) -> Value {
    wait_finished(http, &dev.url, id, Duration::from_secs(60)).await
}

fn base(provider: &str, fake: &FakeLlm) -> String {
    match provider {
        "anthropic" => fake.url.clone(),
        _ => format!("{}/v1", fake.url),
    }
}

fn answer(provider: &str) -> FakeResponse {
    match provider {
        "anthropic" => {
            FakeResponse::sse(fixture("anthropic_stream_after_tool_result_padded.sse"), 64)
        }
        _ => FakeResponse::sse(fixture("openai_stream_text_usage.sse"), 64),
    }
}

fn carries_a_key(headers: &[(String, String)]) -> bool {
    headers.iter().any(|(k, v)| {
        v.contains(OPENAI_CANARY)
            || v.contains(ANTHROPIC_CANARY)
            || k.eq_ignore_ascii_case("authorization")
            || k.eq_ignore_ascii_case("x-api-key")
    })
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread")]
async fn provider_keys_never_leave_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let configured = FakeLlm::start().await.unwrap();
    let attacker = FakeLlm::start().await.unwrap();
    let elsewhere = FakeLlm::start().await.unwrap();
    let allowed = vec![base("openai", &attacker), base("anthropic", &attacker)];
    let dev = start_dev(dir.path(), &configured, &allowed);
    let http = reqwest::Client::new();

    // 1. A session naming the attacker's listener: it gets the request, never a key.
    for provider in ["openai", "anthropic"] {
        attacker.push(answer(provider));
        let (status, v) = create_session(
            &http,
            &dev.url,
            json!({"prompt": "hi", "provider": provider, "model": "m",
                   "base_url": base(provider, &attacker), "tools": []}),
        )
        .await;
        assert_eq!(status, 201, "{provider}: {v}");
        let v = finished(&http, &dev, v["id"].as_str().unwrap()).await;
        assert_eq!(v["status"], "completed", "{provider}: {v}");
    }
    let seen = attacker.requests();
    assert_eq!(seen.len(), 2, "{seen:?}");
    for req in &seen {
        assert!(!carries_a_key(&req.headers), "{req:?}");
    }
    assert_eq!(configured.request_count(), 0);

    // 2. The configured endpoint, which gets the key, answers 307 to another listener:
    //    not followed, so that listener is never contacted; the session fails saying why.
    let target = format!("{}/v1/messages", elsewhere.url);
    configured
        .set_handler(move |_| Some(FakeResponse::json(307, "").with_header("location", &target)));
    let ok = answer("openai");
    elsewhere.set_handler(move |_| Some(ok.clone()));
    for provider in ["openai", "anthropic"] {
        let (status, v) = create_session(
            &http,
            &dev.url,
            json!({"prompt": "hi", "provider": provider, "model": "m", "tools": []}),
        )
        .await;
        assert_eq!(status, 201, "{provider}: {v}");
        let v = finished(&http, &dev, v["id"].as_str().unwrap()).await;
        assert_eq!(v["status"], "failed", "{provider}: {v}");
        assert!(
            v["error"].as_str().unwrap_or_default().contains("redirect"),
            "{provider}: {v}"
        );
    }
    assert_eq!(elsewhere.request_count(), 0);
    let keyed = configured.requests();
    assert_eq!(keyed.len(), 2);
    assert_eq!(
        keyed[0].header("authorization"),
        Some(format!("Bearer {OPENAI_CANARY}").as_str())
    );
    assert_eq!(keyed[1].header("x-api-key"), Some(ANTHROPIC_CANARY));

    // 3. `shell` running `env` in the worker shows none of its environment.
    let (status, v) = create_session(
        &http,
        &dev.url,
        json!({"prompt": "env", "provider": "scripted", "tools": ["shell"]}),
    )
    .await;
    assert_eq!(status, 201, "{v}");
    let id = v["id"].as_str().unwrap().to_string();
    let v = finished(&http, &dev, &id).await;
    assert_eq!(v["status"], "completed", "{v}");
    let transcript = http
        .get(format!("{}/v1/sessions/{id}/messages", dev.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        transcript.contains("PATH="),
        "the shell did not run: {transcript}"
    );
    for leak in [
        OPENAI_CANARY,
        ANTHROPIC_CANARY,
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
    ] {
        assert!(!transcript.contains(leak), "{leak} leaked: {transcript}");
    }

    // 4. Base URLs that could carry the key elsewhere are refused at the door.
    let host = attacker.url.trim_start_matches("http://").to_string();
    for bad in [
        format!("http://user:pw@{host}/v1"),
        format!("http://{host}/v1?x=/"),
        format!("http://{host}/v1#f"),
        format!("ftp://{host}/v1"),
    ] {
        let (status, v) = create_session(
            &http,
            &dev.url,
            json!({"prompt": "hi", "provider": "openai", "base_url": bad}),
        )
        .await;
        assert_eq!(status, 422, "{bad}: {v}");
        assert_eq!(v["error"]["field"], "base_url", "{bad}: {v}");
    }
    assert_eq!(attacker.requests().len(), 2);
}
