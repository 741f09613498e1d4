#![allow(clippy::unwrap_used, clippy::expect_used)]

use serde_json::{Map, Value, json};

use agentq_api::{SessionDetail, SessionView};

use super::api::{ApiFailure, encode};
use super::batch::{Item, Tally, batch_chunks, batch_error};
use super::sessions::table_row;
use super::show::{one_line, pending_lines, shell_word, truncate};
use super::submit::parse_jsonl;
use super::wait::completion_from_view;

#[test]
fn jsonl_lines_get_flag_defaults() {
    let mut d = Map::new();
    d.insert("queue".into(), json!("bulk"));
    let items = parse_jsonl(
        "{\"prompt\":\"a\"}\n\n{\"prompt\":\"b\",\"queue\":\"q2\"}\n",
        "f",
        &d,
    )
    .unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0].body["queue"], "bulk");
    assert_eq!(items[1].body["queue"], "q2");
    // Items are named by their line, from 1, blank lines counted.
    assert_eq!(
        (items[0].origin.as_str(), items[1].origin.as_str()),
        ("f:1", "f:3")
    );
    let e = parse_jsonl("{\"prompt\":\"a\"}\n[1]\n", "f.jsonl", &d).unwrap_err();
    assert_eq!(e.to_string(), "f.jsonl:2: expected a JSON object");
    let e = parse_jsonl("{oops\n", "f.jsonl", &d).unwrap_err();
    assert!(
        e.to_string().starts_with("f.jsonl:1: not valid JSON"),
        "{e}"
    );
    assert!(parse_jsonl("\n", "f", &d).is_err());
}

/// `GET /v1/sessions/{id}` of a session in `status`, as the scheduler answers.
fn view(status: &str, extra: Value) -> SessionView {
    let mut v = json!({
        "prompt": "p", "mode": "act", "max_iterations": 50, "temperature": 0.2,
        "max_tokens": 4096, "tool_timeout_secs": 60, "approval_timeout_secs": 3600,
        "history_window": 200, "max_llm_retries": 3, "retry_delay_ms": 1000,
        "max_background_drain_rounds": 20, "tool_output_max_chars": 50000,
        "id": "s1", "status": status, "finish_reason": null, "result": null,
        "error": null, "iterations": 0, "parent_id": null, "root_id": "s1",
        "usage": {"input_tokens": 0, "output_tokens": 0, "cache_read_tokens": 0,
                  "cache_write_tokens": 0, "reasoning_tokens": 0},
        "depth": 0, "queue": "default", "cancel_requested": false, "attempts": 0,
        "lease_owner": null, "idempotency_key": null, "children": [],
        "created_at": "2026-12-01T08:36:45.123456Z",
        "updated_at": "2026-12-01T08:36:45.123456Z", "finished_at": null,
    });
    if let (Value::Object(v), Value::Object(extra)) = (&mut v, extra) {
        v.extend(extra);
    }
    serde_json::from_value::<SessionDetail>(v).unwrap().session
}

#[test]
fn completion_from_a_terminal_view() {
    let v = view(
        "completed",
        json!({"finish_reason": "stop", "result": "42", "iterations": 2,
               "usage": {"input_tokens": 5, "output_tokens": 7}}),
    );
    let c = completion_from_view(&v).unwrap();
    assert_eq!(c.session_id, "s1");
    assert_eq!(c.result.as_deref(), Some("42"));
    assert_eq!(c.iterations, 2);
    assert_eq!(c.usage.output_tokens, 7);
    assert!(completion_from_view(&view("running", json!({}))).is_none());
}

#[test]
fn table_rows_and_error_bodies() {
    let row = table_row(&view(
        "queued",
        json!({"prompt": "hello\nthere", "usage": {"input_tokens": 5, "output_tokens": 7}}),
    ));
    assert_eq!(
        row,
        [
            "s1",
            "queued",
            "0",
            "12",
            "2026-12-01 08:36:45",
            "hello there"
        ]
        .map(String::from)
    );
    let f = ApiFailure::of(
        422,
        r#"{"error":{"code":"invalid_field","message":"bad","field":"mode"}}"#,
    );
    assert_eq!(f.to_string(), "bad (field `mode`) [HTTP 422 invalid_field]");
    assert_eq!(
        ApiFailure::of(502, "Bad Gateway\n").to_string(),
        "Bad Gateway [HTTP 502 error]"
    );
    assert_eq!(
        ApiFailure::of(500, "{}").to_string(),
        "no details [HTTP 500 error]"
    );
}

#[test]
fn batches_are_cut_by_count_and_by_size() {
    let small = vec![0u8; 25_000];
    let chunks = batch_chunks(&small).unwrap();
    let cuts: Vec<(usize, usize)> = chunks.iter().map(|(o, c)| (*o, c.len())).collect();
    assert_eq!(cuts, [(0, 10_000), (10_000, 10_000), (20_000, 5_000)]);
    let big = vec!["x".repeat(1024 * 1024); 70];
    let chunks = batch_chunks(&big).unwrap();
    assert!(chunks.len() >= 3, "{}", chunks.len());
    let mut next = 0;
    for (offset, chunk) in &chunks {
        assert_eq!(*offset, next);
        next += chunk.len();
        assert!(serde_json::to_vec(chunk).unwrap().len() < agentq_scheduler::BATCH_BODY_LIMIT);
    }
    assert_eq!(next, 70);
    assert!(batch_chunks::<u8>(&[]).unwrap().is_empty());
}

#[test]
fn batch_errors_name_the_line_the_user_wrote() {
    let items: Vec<Item> = (0..20_005)
        .map(|i| Item {
            // Line i + 2: the file starts with a blank line.
            origin: format!("tasks.jsonl:{}", i + 2),
            body: json!({}),
        })
        .collect();
    let refused = |field: &str| ApiFailure {
        status: 422,
        code: "invalid_field".into(),
        message: "bad".into(),
        field: Some(field.into()),
    };
    // Item 3 of the chunk starting at item 20,000: item 20,003, line 20,005.
    let e = batch_error(refused("[3].mode").into(), 20_000, 20_000, &items);
    let inner = e.downcast_ref::<ApiFailure>().unwrap();
    assert_eq!(inner.field.as_deref(), Some("mode"));
    let text = format!("{e:#}");
    assert!(text.contains("20000 sessions"), "{text}");
    assert!(
        text.ends_with("tasks.jsonl:20005: bad (field `mode`) [HTTP 422 invalid_field]"),
        "{text}"
    );
    // An item refused as a whole names no field; one of the first chunk, nothing before.
    let e = batch_error(refused("[0]").into(), 0, 0, &items);
    assert_eq!(
        format!("{e:#}"),
        "tasks.jsonl:2: bad [HTTP 422 invalid_field]"
    );
    assert!(e.downcast_ref::<ApiFailure>().unwrap().field.is_none());
    // A field that names no item is left as the server wrote it.
    let e = batch_error(refused("max_running").into(), 0, 0, &items);
    assert_eq!(
        format!("{e:#}"),
        "bad (field `max_running`) [HTTP 422 invalid_field]"
    );
}

#[test]
fn the_progress_line_counts_and_costs() {
    let t = Tally {
        done: 12,
        failed: 2,
        running: 3,
        tokens: 15_234,
        cost_usd: Some(0.01234),
    };
    assert_eq!(
        t.line(20),
        "12/20 done · 2 failed · 3 running · 15234 tokens · $0.0123"
    );
    let t = Tally::default();
    assert_eq!(t.line(1), "0/1 done · 0 failed · 0 running · 0 tokens");
}

#[test]
fn helpers() {
    assert_eq!(truncate("abcdef", 4), "abc…");
    assert_eq!(truncate("abc", 4), "abc");
    assert_eq!(encode("a b/c"), "a%20b%2Fc");
    assert_eq!(one_line("a\n  b", 10), "a b");
    assert_eq!(one_line("abcdef", 3), "abc…");
}

#[test]
fn held_call_ids_are_pasteable() {
    assert_eq!(shell_word("call_AbC-1.2:3"), "call_AbC-1.2:3");
    assert_eq!(shell_word("a b"), "'a b'");
    assert_eq!(shell_word("$(rm -rf ~)"), "'$(rm -rf ~)'");
    assert_eq!(shell_word("it's"), r"'it'\''s'");
    assert_eq!(shell_word(""), "''");
    // No raw control character reaches the terminal.
    assert_eq!(shell_word("a\u{1b}[2J'"), r"$'a\u001b[2J\''");
}

#[test]
fn pending_approvals_say_how_to_decide() {
    assert!(pending_lines("s1", &[]).is_empty());
    let deadline = serde_json::from_value(json!("2026-12-01T09:00:00Z")).unwrap();
    let held = |id: &str, args: Value| agentq_api::PendingApproval {
        tool_call_id: id.into(),
        tool: "write_file".into(),
        arguments: args,
        deadline: Some(deadline),
    };
    let lines = pending_lines(
        "s1",
        &[
            held("c1", json!({"path": "a.txt"})),
            held("c 2", json!({"content": "x".repeat(500)})),
        ],
    );
    assert_eq!(
        lines[0],
        "2 tool call(s) await approval (denied as `timeout` after 2026-12-01T09:00:00+00:00):"
    );
    assert_eq!(lines[1], r#"  c1 write_file({"path":"a.txt"})"#);
    assert_eq!(
        lines[2],
        "      agentq approve s1 c1  |  agentq deny s1 c1 --reason '...'"
    );
    assert!(lines[3].starts_with("  'c 2' write_file({\"content\":\"xxx"));
    assert!(
        lines[3].ends_with("…)") && lines[3].chars().count() < 160,
        "{}",
        lines[3]
    );
    assert!(lines[4].contains("agentq approve s1 'c 2'"), "{}", lines[4]);
}
