//! A batch shaped to cost the most memory per byte: metadata of many tiny nested arrays
//! (`[[0],[0],…]`), where each few bytes of the body become a parsed value and an
//! allocation. Parsing it must stay within the bound a plain batch keeps (about twice its
//! body), or be refused. Measured as this process's peak resident size; the binary holds
//! this one test so that nothing else allocates meanwhile.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use agentq_scheduler::request::{Limits, parse_batch_bytes};

use common::{reset_peak, status_kb};

#[test]
fn a_batch_of_tiny_nested_values_is_parsed_within_twice_its_size_or_refused() {
    let items = 7_000;
    // Within every per-object bound: 1,000 entries per array, a few keys.
    let tiny = format!("[{}]", vec!["[0]"; 1_000].join(","));
    let item = format!(r#"{{"prompt":"p","metadata":{{"a":{tiny}}}}}"#);
    let body = format!("[{}]", vec![item; items].join(",")).into_bytes();
    assert!(
        body.len() < agentq_scheduler::BATCH_BODY_LIMIT,
        "{}",
        body.len()
    );
    let body_kb = (body.len() / 1024) as u64;
    let limits = Limits {
        max_prompt_bytes: 1_000_000,
        max_batch: 10_000,
        files: agentq_core::workspace_path::FileLimits::DEFAULT,
    };
    let before = reset_peak();
    let parsed = parse_batch_bytes(&body, &limits);
    let peak = status_kb("VmHWM:");
    let added = peak.saturating_sub(before);
    let ratio = (body_kb + added) as f64 / body_kb as f64;
    assert!(
        ratio <= 2.5,
        "parsing a {body_kb} kB batch of tiny values peaked {added} kB above it: {ratio:.2}x \
         the body (refused: {})",
        parsed.is_err()
    );
    if let Err(e) = parsed {
        let e = format!("{e:?}");
        assert!(e.contains("TooLarge"), "{e}");
    }
    drop(body);

    // A full batch of short sessions is no such body.
    let short: Vec<String> = (0..limits.max_batch)
        .map(|i| {
            format!(r#"{{"prompt":"p{i}","tools":["read_file","grep"],"metadata":{{"u":"{i}","t":["a","b"]}}}}"#)
        })
        .collect();
    let body = format!("[{}]", short.join(","));
    assert_eq!(
        parse_batch_bytes(body.as_bytes(), &limits).unwrap().len(),
        limits.max_batch
    );
}
