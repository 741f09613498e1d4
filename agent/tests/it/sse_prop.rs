//! The SSE parser yields the same events for any split of the byte stream: every recorded
//! `.sse` fixture and a synthetic stream with mixed line ends and multi-byte UTF-8.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use agentq_agent::provider::sse::{SseEvent, SseParser};
use proptest::prelude::*;

/// Mixed `\r\n`, `\r` and `\n` line ends, comments, multi-line data, `event:`/`id:`, no space
/// after the colon, trailing spaces, multi-byte UTF-8 (2, 3 and 4 bytes), and a last event
/// with no blank line after it.
const SYNTHETIC: &str = concat!(
    ": keep-alive\r\n",
    "event: message_start\r\n",
    "id: 1\r\n",
    "data: {\"text\":\"héllo wörld\"}   \r\n",
    "\r\n",
    "data:first line\r",
    "data: 第二行 — 🦀🦀\r",
    "\r",
    "event: ping\n",
    "data\n",
    "\n",
    ":comment only\n\n",
    "data: Ünïcödé €\r\n",
    "data: [DONE]",
);

fn fixtures() -> Vec<(String, Vec<u8>)> {
    let dir = agentq_testkit::fixtures_dir();
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "sse"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            let bytes = std::fs::read(&p).unwrap();
            (name, bytes)
        })
        .collect();
    out.sort();
    assert!(out.len() >= 5, "expected the recorded .sse fixtures");
    out.push(("synthetic".into(), SYNTHETIC.as_bytes().to_vec()));
    out
}

fn whole(bytes: &[u8]) -> Vec<SseEvent> {
    let mut p = SseParser::new();
    let mut v = p.push(bytes);
    v.extend(p.finish());
    v
}

fn split(bytes: &[u8], sizes: &[usize]) -> Vec<SseEvent> {
    let mut p = SseParser::new();
    let mut v = Vec::new();
    let mut rest = bytes;
    let mut sizes = sizes.iter().cycle();
    while !rest.is_empty() {
        let n = (*sizes.next().unwrap()).min(rest.len());
        // Empty chunks happen on the wire (and must not disturb a pending `\r`).
        v.extend(p.push(&[]));
        v.extend(p.push(&rest[..n]));
        rest = &rest[n..];
    }
    v.extend(p.finish());
    v
}

#[test]
fn synthetic_stream_parses_as_specified() {
    let ev = |event: Option<&str>, data: &str, id: Option<&str>| SseEvent {
        event: event.map(str::to_string),
        data: data.to_string(),
        id: id.map(str::to_string),
    };
    assert_eq!(
        whole(SYNTHETIC.as_bytes()),
        vec![
            ev(
                Some("message_start"),
                "{\"text\":\"héllo wörld\"}   ",
                Some("1")
            ),
            ev(None, "first line\n第二行 — 🦀🦀", Some("1")),
            ev(Some("ping"), "", Some("1")),
            ev(None, "Ünïcödé €\n[DONE]", Some("1")),
        ]
    );
}

#[test]
fn fixtures_parse_to_json_events() {
    for (name, bytes) in fixtures() {
        let events = whole(&bytes);
        assert!(!events.is_empty(), "{name}: no events");
        if name == "synthetic" {
            continue;
        }
        for e in &events {
            let d = e.data.trim();
            assert!(
                d == "[DONE]" || serde_json::from_str::<serde_json::Value>(d).is_ok(),
                "{name}: not JSON: {d:?}"
            );
        }
    }
}

#[test]
fn byte_at_a_time_equals_whole() {
    for (name, bytes) in fixtures() {
        assert_eq!(split(&bytes, &[1]), whole(&bytes), "{name}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn any_split_equals_whole(
        which in 0usize..64,
        sizes in prop::collection::vec(1usize..40, 1..64),
    ) {
        let all = fixtures();
        let (name, bytes) = &all[which % all.len()];
        prop_assert_eq!(split(bytes, &sizes), whole(bytes), "{}", name);
    }

    #[test]
    fn any_split_of_synthetic_equals_whole(sizes in prop::collection::vec(1usize..8, 1..32)) {
        let bytes = SYNTHETIC.as_bytes();
        prop_assert_eq!(split(bytes, &sizes), whole(bytes));
    }
}

/// Lines an SSE stream of either provider is made of, for streams that are almost right.
fn sse_line() -> impl Strategy<Value = Vec<u8>> {
    let data = prop_oneof![
        Just(r#"{"type":"message_start","message":{"usage":{"input_tokens":5}}}"#.to_string()),
        Just(r#"{"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"grep"}}"#.to_string()),
        Just(r#"{"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"q\":"}}"#.to_string()),
        Just(r#"{"type":"content_block_delta","index":18446744073709551615,"delta":{"type":"text_delta","text":"hi"}}"#.to_string()),
        Just(r#"{"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":18446744073709551615}}"#.to_string()),
        Just(r#"{"type":"message_stop"}"#.to_string()),
        Just(r#"{"type":"error","error":{"type":"overloaded_error","message":"x"}}"#.to_string()),
        Just(r#"{"choices":[{"index":0,"delta":{"content":"hi","tool_calls":[{"index":4294967295,"id":"c","function":{"name":"f","arguments":"{"}}]}}]}"#.to_string()),
        Just(r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":{"a":1}}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":18446744073709551615,"completion_tokens":18446744073709551615}}"#.to_string()),
        Just(r#"{"error":{"message":"boom","code":502}}"#.to_string()),
        Just("[DONE]".to_string()),
        "[ -~\u{0}é🦀]{0,40}",
    ];
    prop_oneof![
        4 => data.prop_map(|d| format!("data: {d}\n\n").into_bytes()),
        1 => prop::sample::select(vec!["event: message_start\n", ": ping\n", "\n", "\r\n", "id: 7\n", "retry: x\n"])
            .prop_map(|l| l.as_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 0..24),
    ]
}

fn sse_stream() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(sse_line(), 0..24).prop_map(|lines| lines.concat())
}

/// The anthropic decoder over every event of `bytes`: it never panics, whatever it is fed
/// (an error ends a real stream; here the decoder is fed on, to reach more states).
fn anthropic_decode(events: &[SseEvent]) {
    let mut d = agentq_agent::provider::anthropic::StreamDecoder::new();
    for ev in events {
        let _ = d.handle(ev);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary bytes, arbitrarily split: never a panic, and the split does not matter.
    #[test]
    fn arbitrary_bytes_parse_the_same_in_any_split(
        bytes in prop::collection::vec(any::<u8>(), 0..512),
        sizes in prop::collection::vec(1usize..16, 1..16),
    ) {
        prop_assert_eq!(split(&bytes, &sizes), whole(&bytes));
    }

    /// Almost-right provider streams, arbitrarily split, through the SSE parser and the
    /// anthropic decoder: never a panic.
    #[test]
    fn provider_streams_never_panic(
        bytes in sse_stream(),
        sizes in prop::collection::vec(1usize..32, 1..16),
    ) {
        let events = split(&bytes, &sizes);
        prop_assert_eq!(&events, &whole(&bytes));
        anthropic_decode(&events);
    }
}
