//! The sections with tables of their own: hooks, the guardian, prices, budgets, limits and
//! the S3 blob store.

use agentq_agent::guard::{Behavior, HookPoint, OnTruncated};

use super::env_of;
use crate::config::*;

#[test]
fn hooks_and_the_guardian_from_the_file() {
    let file = r#"
        [[hooks]]
        on = "pre_tool_use"
        url = "https://hooks.example/check"
        timeout_ms = 2000
        on_timeout = "allow"
        tools = ["write_*", "shell"]
        header = "Authorization"
        header_env = "HOOK_TOKEN"

        [[hooks]]
        on = "session_end"
        command = ["/usr/local/bin/notify", "--json"]

        [guardian]
        provider = "anthropic"
        prompt = "Deny deletions."
        tools = ["shell"]
    "#;
    let path = std::env::temp_dir().join(format!("agentq-hooks-{}.toml", std::process::id()));
    std::fs::write(&path, file).unwrap();
    let s = Settings::load_with(Some(&path), env_of(&[("HOOK_TOKEN", "Bearer t0k")])).unwrap();
    std::fs::remove_file(&path).unwrap();
    s.validate().unwrap();
    let [pre, end] = s.hooks.as_slice() else {
        panic!("{:?}", s.hooks)
    };
    assert_eq!(pre.on, HookPoint::PreToolUse);
    assert_eq!(pre.url.as_deref(), Some("https://hooks.example/check"));
    assert_eq!(pre.timeout_ms, 2000);
    assert_eq!(pre.timeout_behavior(), Behavior::Allow);
    // Unset: a pre_tool_use hook that fails blocks the call.
    assert_eq!(pre.error_behavior(), Behavior::Deny);
    assert_eq!(
        pre.header_value.as_ref().map(Secret::expose),
        Some("Bearer t0k")
    );
    // The secret never serialises, never prints.
    assert!(!serde_json::to_string(&s).unwrap().contains("t0k"));
    assert!(!format!("{s:?}").contains("t0k"));
    assert_eq!(end.on, HookPoint::SessionEnd);
    assert_eq!(end.timeout_ms, DEFAULT_HOOK_TIMEOUT_MS);
    assert_eq!(end.command.as_ref().unwrap()[0], "/usr/local/bin/notify");
    assert_eq!(s.guardian.provider.as_deref(), Some("anthropic"));
    assert_eq!(s.guardian.on_error, Behavior::Deny);
    // Unset: a call the guardian cannot see whole is denied unasked.
    assert_eq!(s.guardian.on_truncated, OnTruncated::Deny);
    assert_eq!(s.guardian.timeout_ms, DEFAULT_GUARDIAN_TIMEOUT_MS);
    let review =
        Settings::from_toml("[guardian]\nprovider = \"openai\"\non_truncated = \"review\"\n")
            .unwrap();
    review.validate().unwrap();
    assert_eq!(review.guardian.on_truncated, OnTruncated::Review);

    // Only the full environment layer reads header secrets.
    let path = std::env::temp_dir().join(format!("agentq-hooks-o-{}.toml", std::process::id()));
    std::fs::write(&path, file).unwrap();
    let only =
        Settings::load_only(Some(&path), env_of(&[("HOOK_TOKEN", "x")]), &["api_url"]).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(only.hooks[0].header_value.is_none());
}

#[test]
fn hook_and_guardian_rules_name_the_field() {
    let parse_err = |text: &str| Settings::from_toml(text).unwrap_err().to_string();
    let e = parse_err("[[hooks]]\non = \"pre_tool\"\nurl = \"http://h/\"\n");
    assert!(e.contains("pre_tool"), "{e}");
    let e = parse_err("[[hooks]]\non = \"pre_tool_use\"\nurl = \"http://h/\"\nheaders = {}\n");
    assert!(e.contains("headers"), "{e}");
    let e =
        parse_err("[[hooks]]\non = \"pre_tool_use\"\nurl = \"http://h/\"\non_error = \"maybe\"\n");
    assert!(e.contains("maybe"), "{e}");
    let e = parse_err("[guardian]\nprovider = \"openai\"\non_truncated = \"cut\"\n");
    assert!(e.contains("cut") && e.contains("on_truncated"), "{e}");

    let invalid = |text: &str| {
        Settings::from_toml(text)
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string()
    };
    let hook = |body: &str| format!("[[hooks]]\non = \"pre_tool_use\"\n{body}\n");
    for (body, field) in [
        ("", "`hooks[0]`"),
        ("url = \"http://h/\"\ncommand = [\"x\"]", "`hooks[0].url`"),
        ("url = \"ftp://h/\"", "`hooks[0].url`"),
        ("url = \"http:///path\"", "`hooks[0].url`"),
        ("url = \"https://user:pw@h/\"", "`hooks[0].url`"),
        ("command = []", "`hooks[0].command`"),
        ("command = [\" \"]", "`hooks[0].command`"),
        (
            "url = \"http://h/\"\ntimeout_ms = 0",
            "`hooks[0].timeout_ms`",
        ),
        (
            "url = \"http://h/\"\ntimeout_ms = 60001",
            "`hooks[0].timeout_ms`",
        ),
        ("url = \"http://h/\"\ntools = []", "`hooks[0].tools`"),
        (
            "url = \"http://h/\"\nheader = \"X-Token\"",
            "`hooks[0].header_env`",
        ),
        (
            "url = \"http://h/\"\nheader_env = \"TOKEN\"",
            "`hooks[0].header`",
        ),
        (
            "url = \"http://h/\"\nheader = \"Bad Header\"\nheader_env = \"T\"",
            "`hooks[0].header`",
        ),
        (
            "url = \"http://h/\"\nheader = \"X-T\"\nheader_env = \"NOT-A-VAR\"",
            "`hooks[0].header_env`",
        ),
        (
            "command = [\"x\"]\nheader = \"X-T\"\nheader_env = \"T\"",
            "`hooks[0].header`",
        ),
    ] {
        let e = invalid(&hook(body));
        assert!(e.contains(field), "{body:?}: {field} not in {e}");
    }
    // Observing points do not decide.
    let e =
        invalid("[[hooks]]\non = \"post_tool_use\"\nurl = \"http://h/\"\non_error = \"allow\"\n");
    assert!(e.contains("`hooks[0].on_error`"), "{e}");
    let e = invalid("[[hooks]]\non = \"session_start\"\nurl = \"http://h/\"\ntools = [\"x\"]\n");
    assert!(e.contains("`hooks[0].tools`"), "{e}");
    // The second hook is named as the second.
    let e = invalid(
        "[[hooks]]\non = \"pre_tool_use\"\nurl = \"http://h/\"\n\n[[hooks]]\non = \"session_end\"\nurl = \"nope\"\n",
    );
    assert!(e.contains("`hooks[1].url`"), "{e}");

    for (body, field) in [
        ("provider = \"gpt\"", "`guardian.provider`"),
        ("provider = \"openai\"\nmodel = \" \"", "`guardian.model`"),
        ("provider = \"openai\"\nprompt = \"\"", "`guardian.prompt`"),
        (
            "provider = \"openai\"\ntimeout_ms = 0",
            "`guardian.timeout_ms`",
        ),
        (
            "provider = \"openai\"\ntimeout_ms = 300001",
            "`guardian.timeout_ms`",
        ),
        ("provider = \"openai\"\ntools = []", "`guardian.tools`"),
    ] {
        let e = invalid(&format!("[guardian]\n{body}\n"));
        assert!(e.contains(field), "{body:?}: {field} not in {e}");
    }
}

#[test]
fn prices_and_budgets_from_the_file() {
    let file = r#"
        [[prices]]
        model = "gpt-4o-mini*"
        input = 0.15
        output = 0.60
        cache_read = 0.075

        [[prices]]
        model = "claude-*"
        input = 3.0
        output = 15.0
        web_search = 10.0

        [[budgets]]
        tenant = "acme"
        period = "month"
        usd = 20.0
        on_budget = "park"

        [policy]
        max_tree_sessions = 50
    "#;
    let s: Settings = toml::from_str(file).unwrap();
    s.validate().unwrap();
    assert_eq!(s.prices[0].cache_write, 0.0);
    assert_eq!(s.prices[0].web_search, None);
    assert_eq!(s.prices[1].web_search, Some(10.0));
    assert_eq!(s.policy.max_tree_sessions, Some(50));
    let b = s.budgets[0].budget();
    assert_eq!(b.usd_nanos, Some(20_000_000_000));
    assert_eq!(b.tokens, None);
    assert_eq!(b.on_budget, crate::budget::OnBudget::Park);
    // on_budget defaults to fail; an unknown period or field is refused.
    let s: Settings =
        toml::from_str("[[budgets]]\ntenant = \"a\"\nperiod = \"day\"\ntokens = 5\n").unwrap();
    assert_eq!(s.budgets[0].on_budget, crate::budget::OnBudget::Fail);
    assert!(
        toml::from_str::<Settings>("[[budgets]]\ntenant = \"a\"\nperiod = \"week\"\ntokens = 5\n")
            .is_err()
    );
    assert!(toml::from_str::<Settings>("[[prices]]\nmodel = \"a\"\nprice = 5\n").is_err());
}

#[test]
fn limit_rules_parse_and_name_the_field() {
    let s = Settings::from_toml(
        "[[limits]]\nprovider = \"openai\"\nmodel = \"gpt-4o*\"\nrpm = 500\ntpm = 200000\n\
         [[limits]]\nprovider = \"anthropic\"\ntenant = \"acme\"\nconcurrency = 4\n",
    )
    .unwrap();
    s.validate().unwrap();
    assert_eq!(s.limits.len(), 2);
    assert_eq!(s.limits[0].rpm, Some(500));
    assert_eq!(s.limits[0].window_secs, 60);
    assert_eq!(s.limits[1].model, "*");
    assert_eq!(s.limits[1].tenant.as_deref(), Some("acme"));
    assert_eq!(s.limits[1].reservation_ttl_secs, 300);
    let e = Settings::from_toml("[[limits]]\nprovider = \"openai\"\nrmp = 5\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("rmp"), "{e}");
    let invalid = |body: &str| {
        Settings::from_toml(&format!("[[limits]]\n{body}\n"))
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string()
    };
    for (body, field) in [
        ("provider = \"openai\"", "`limits[0].rpm`"),
        ("provider = \"azure\"\nrpm = 1", "`limits[0].provider`"),
        (
            "provider = \"openai\"\nmodel = \"gpt-[\"\nrpm = 1",
            "`limits[0].model`",
        ),
        (
            "provider = \"openai\"\ntenant = \" \"\nrpm = 1",
            "`limits[0].tenant`",
        ),
        ("provider = \"openai\"\nrpm = 0", "`limits[0].rpm`"),
        ("provider = \"openai\"\ntpm = 0", "`limits[0].tpm`"),
        (
            "provider = \"openai\"\nconcurrency = 0",
            "`limits[0].concurrency`",
        ),
        (
            "provider = \"openai\"\nrpm = 1\nwindow_secs = 61",
            "`limits[0].window_secs`",
        ),
        (
            "provider = \"openai\"\nrpm = 1\nreservation_ttl_secs = 0",
            "`limits[0].reservation_ttl_secs`",
        ),
    ] {
        let e = invalid(body);
        assert!(e.contains(field), "{body}: {e}");
    }
}

#[test]
fn s3_blob_store_settings() {
    let base = "[workspace]\nblob_store = \"s3\"\n[workspace.s3]\n";
    let ok = format!(
        "{base}bucket = \"agentq-ws\"\nendpoint = \"http://127.0.0.1:9000\"\n\
         access_key_env = \"MY_KEY\"\nsecret_key_env = \"MY_SECRET\"\n"
    );
    let s = Settings::from_toml(&ok).unwrap();
    s.validate().unwrap();
    assert_eq!(s.workspace.blob_store, BlobStoreKind::S3);
    assert_eq!(s.workspace.s3.secret_key_env, "MY_SECRET");
    assert_eq!(
        Settings::default().workspace.s3.access_key_env,
        "AWS_ACCESS_KEY_ID"
    );
    for (text, key) in [
        (
            format!("{base}bucket = \"Bad/Name\"\nendpoint = \"http://h\"\n"),
            "workspace.s3.bucket",
        ),
        (
            format!("{base}bucket = \"ok-name\"\nendpoint = \"ftp://h\"\n"),
            "workspace.s3.endpoint",
        ),
        (
            format!("{base}bucket = \"ok-name\"\nendpoint = \"http://h\"\nprefix = \"/abs\"\n"),
            "workspace.s3.prefix",
        ),
        (
            format!("{base}bucket = \"ok-name\"\nendpoint = \"http://h\"\nregion = \"a b\"\n"),
            "workspace.s3.region",
        ),
    ] {
        let e = Settings::from_toml(&text).unwrap().validate().unwrap_err();
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
    // A secret typed where the variable's name belongs is refused, and not echoed.
    let e = Settings::from_toml(&format!(
        "{base}bucket = \"ok-name\"\nendpoint = \"http://h\"\nsecret_key_env = \"wJalr/K7MDENG\"\n"
    ))
    .unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("workspace.s3.secret_key_env"), "{msg}");
    assert!(!msg.contains("wJalr"), "{msg}");
    // Without `blob_store = "s3"` the section is not checked.
    Settings::from_toml("[workspace.s3]\nbucket = \"x\"\n")
        .unwrap()
        .validate()
        .unwrap();
}
