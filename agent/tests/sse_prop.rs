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
