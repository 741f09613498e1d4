//! `POST /v1/sessions/{id}/fork` against a real Postgres and Redis: a fork from a step
//! shows the shared prefix and its message, runs with the overrides, and leaves the origin
//! as it was; every bad request is a 422 naming its field (a step past the end, negative
//! or missing, an override the tenant's policy refuses, an unknown field, an empty
//! message), and another tenant's session is as missing as one that does not exist.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use agentq_agent::schema::Message;
use agentq_agent::spec::ExitReason;
use agentq_agent::state::Outcome;
use agentq_core::Claim;
use agentq_core::config::{PolicySection, TenantPolicySection};
use agentq_core::policy::Policy;
use agentq_scheduler::SchedulerSettings;

use crate::common::Served;

/// The served scheduler (acme's policy: `gpt-*` models, a budget of 1,000 tokens), and
/// the calls these tests make of it.
struct Env(Served);

impl std::ops::Deref for Env {
    type Target = Served;
    fn deref(&self) -> &Served {
        &self.0
    }
}

impl Env {
    async fn start() -> Env {
        let mut section = PolicySection::default();
        section.tenants.insert(
            "acme".into(),
            TenantPolicySection {
                models: Some(vec!["gpt-*".into()]),
                token_budget: Some(1000),
                ..Default::default()
            },
        );
        let settings = SchedulerSettings {
            policy: Arc::new(Policy::from_section(&section).unwrap()),
            ..SchedulerSettings::default()
        };
        Env(Served::start(settings).await)
    }

    async fn call(&self, post: Option<&Value>, path: &str, key: &str) -> (u16, Value) {
        let c = reqwest::Client::new();
        let url = format!("{}{path}", self.base);
        let r = match post {
            Some(body) => c.post(url).json(body),
            None => c.get(url),
        }
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    /// A finished session of acme's with two iterations (two answers, no tools).
    async fn origin(&self) -> String {
        let body = json!({"prompt": "the task", "model": "gpt-a", "token_budget": 500});
        let (s, v) = self.call(Some(&body), "/v1/sessions", &self.acme).await;
        assert_eq!(s, 201, "{v}");
        let id = v["id"].as_str().unwrap().to_string();
        let Claim::Acquired {
            lease, mut state, ..
        } = self
            .store
            .claim(&id, "w", Duration::from_secs(30), 10)
            .await
            .unwrap()
        else {
            panic!("not claimed")
        };
        state.push_assistant(Message::assistant("first answer"));
        self.store.checkpoint(&lease, &state, 1).await.unwrap();
        state.push_assistant(Message::assistant("second answer"));
        state.outcome = Some(Outcome {
            reason: ExitReason::Stop,
            result: Some("second answer".into()),
            error: None,
        });
        self.store.checkpoint(&lease, &state, 2).await.unwrap();
        id
    }
}

fn field(v: &Value) -> &str {
    v["error"]["field"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_shares_the_prefix_takes_overrides_and_leaves_the_origin() {
    let env = Env::start().await;
    let id = env.origin().await;
    let path = format!("/v1/sessions/{id}");
    let before = env.call(None, &path, &env.acme).await;
    let msgs_before = env.call(None, &format!("{path}/messages"), &env.acme).await;

    let body = json!({"at_iteration": 1, "message": "try another way", "model": "gpt-b"});
    let (s, v) = env
        .call(Some(&body), &format!("{path}/fork"), &env.acme)
        .await;
    assert_eq!(s, 201, "{v}");
    assert_eq!(v["forked_from"], json!(id));
    assert_eq!(v["at_iteration"], json!(1));
    assert_eq!(v["status"], json!("queued"));
    let fork = v["id"].as_str().unwrap().to_string();

    let (s, f) = env
        .call(None, &format!("/v1/sessions/{fork}"), &env.acme)
        .await;
    assert_eq!(s, 200, "{f}");
    assert_eq!(f["forked_from"], json!(id));
    assert_eq!(f["fork_at"], json!(2));
    assert_eq!(f["iterations"], json!(1));
    assert_eq!(f["model"], json!("gpt-b"));
    assert_eq!(f["token_budget"], json!(500));
    assert_eq!(f["prompt"], json!("the task"));
    assert_eq!(f["usage"]["input_tokens"], json!(0));
    let (_, m) = env
        .call(None, &format!("/v1/sessions/{fork}/messages"), &env.acme)
        .await;
    let contents: Vec<&str> = m["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(contents, ["the task", "first answer", "try another way"]);

    // The origin, byte for byte.
    assert_eq!(env.call(None, &path, &env.acme).await, before);
    assert_eq!(
        env.call(None, &format!("{path}/messages"), &env.acme).await,
        msgs_before
    );
    // Another tenant's session is not found, like a missing one.
    let (s, v) = env
        .call(Some(&body), &format!("{path}/fork"), &env.globex)
        .await;
    assert_eq!(s, 404, "{v}");
    let (s, _) = env
        .call(Some(&body), "/v1/sessions/nope/fork", &env.acme)
        .await;
    assert_eq!(s, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_forks_are_422_naming_the_field() {
    let env = Env::start().await;
    let id = env.origin().await;
    let path = format!("/v1/sessions/{id}/fork");
    let sessions = env.store.count_unfinished().await.unwrap();
    for (body, name) in [
        (json!({"at_iteration": 3}), "at_iteration"),
        (json!({"at_iteration": -1}), "at_iteration"),
        (json!({}), "at_iteration"),
        (json!({"at_iteration": "1"}), "at_iteration"),
        (json!({"at_iteration": 1, "model": "claude-x"}), "model"),
        (
            json!({"at_iteration": 1, "token_budget": 5000}),
            "token_budget",
        ),
        (
            json!({"at_iteration": 1, "tools": ["no_such_tool"]}),
            "tools",
        ),
        (json!({"at_iteration": 1, "message": ""}), "message"),
        (json!({"at_iteration": 1, "prompt": "x"}), "prompt"),
    ] {
        let (s, v) = env.call(Some(&body), &path, &env.acme).await;
        assert_eq!(s, 422, "{body}: {v}");
        assert!(field(&v).starts_with(name), "{body}: {v}");
    }
    let (_, v) = env
        .call(Some(&json!({"at_iteration": 3})), &path, &env.acme)
        .await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2 iterations"),
        "{v}"
    );
    // Nothing was created.
    assert_eq!(env.store.count_unfinished().await.unwrap(), sessions);
}
