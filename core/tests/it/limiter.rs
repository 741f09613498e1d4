//! The fleet-wide rate limiter against a real, private `redis-server`: its Lua scripts
//! under many concurrent reservers, the expiry of a dead worker's reservation, token
//! correction by the reported usage, a hold learned from a 429 shared by every worker,
//! and failing open when Redis is gone and the configuration says so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use agentq_agent::driver::{Admission, Admit, CallAsk, CallReport, Permit};
use agentq_agent::provider::openai::{OpenAiConfig, OpenAiProvider};
use agentq_agent::provider::{HttpTimeouts, RateLimitInfo};
use agentq_agent::schema::Usage;
use agentq_core::admission::{Limiter, read_state};
use agentq_core::config::LimitSettings;
use agentq_testkit::services::RedisServer;
use tokio_util::sync::CancellationToken;

fn provider(key: &str) -> OpenAiProvider {
    OpenAiProvider::new(OpenAiConfig {
        base_url: "http://127.0.0.1:9/v1".into(),
        api_key: Some(key.into()),
        timeouts: HttpTimeouts::default(),
        transport: Default::default(),
        extra_headers: Vec::new(),
    })
    .unwrap()
}

fn limit(toml: &str) -> LimitSettings {
    toml::from_str(toml).unwrap()
}

async fn limiter(server: &RedisServer, limits: &[LimitSettings]) -> Arc<Limiter> {
    Limiter::connect(&server.url(), limits, CancellationToken::new())
        .await
        .unwrap()
}

fn ask(input: u64, max_out: u64) -> CallAsk<'static> {
    CallAsk {
        model: "gpt-4o",
        input_tokens: input,
        max_output_tokens: max_out,
        web_searches: 0,
        max_wait: Duration::ZERO,
    }
}

/// Reserve until admitted (bounded), sleeping as told.
pub(crate) async fn admitted(a: &dyn Admission, ask: &CallAsk<'_>) -> Permit {
    for _ in 0..10_000 {
        match a.reserve(ask).await {
            Admit::Go(p) => return p,
            Admit::Wait { after, .. } => tokio::time::sleep(after).await,
            Admit::Exhausted { message, .. } => panic!("{message}"),
            Admit::Children { .. } => panic!("the limiter keeps no budget"),
        }
    }
    panic!("never admitted")
}

/// One call through `gate`: admitted, counted in `in_flight` for a moment (`most` keeps
/// the highest count seen), then settled.
pub(crate) async fn call_counted(
    gate: &dyn Admission,
    ask: &CallAsk<'_>,
    in_flight: &AtomicUsize,
    most: &AtomicUsize,
) {
    let p = admitted(gate, ask).await;
    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(3)).await;
    in_flight.fetch_sub(1, Ordering::SeqCst);
    gate.settle(ask, p, &CallReport::default()).await;
}

async fn raw(server: &RedisServer) -> redis::aio::ConnectionManager {
    redis::aio::ConnectionManager::new(redis::Client::open(server.url()).unwrap())
        .await
        .unwrap()
}

#[tokio::test]
async fn concurrency_holds_across_many_reservers_on_several_workers() {
    let server = RedisServer::start().unwrap();
    let rules = [limit("provider = \"openai\"\nconcurrency = 3")];
    // Three "workers", each with its own limiter and connection.
    let mut gates = Vec::new();
    for _ in 0..3 {
        gates.push(
            limiter(&server, &rules)
                .await
                .for_session("t", &provider("k")),
        );
    }
    let in_flight = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..60 {
        let gate = gates[i % 3].clone();
        let (in_flight, most) = (in_flight.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            call_counted(&*gate, &ask(10, 10), &in_flight, &most).await;
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(most.load(Ordering::SeqCst) <= 3, "{most:?}");
    assert!(most.load(Ordering::SeqCst) >= 1);
    // Every slot is given back (settles run off the call path: wait for them).
    let mut conn = raw(&server).await;
    for _ in 0..200 {
        let state = read_state(&mut conn).await.unwrap();
        if state.rules[0].in_flight == 0 {
            assert_eq!(state.rules[0].concurrency, 3);
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("slots were not released");
}

#[tokio::test]
async fn requests_per_window_are_exact_and_the_wait_says_until_when() {
    let server = RedisServer::start().unwrap();
    // 600 a minute over a one-second window: 10 per window.
    let rules = [limit(
        "provider = \"openai\"\nmodel = \"gpt-4o*\"\nrpm = 600\nwindow_secs = 1",
    )];
    let gate = limiter(&server, &rules)
        .await
        .for_session("t", &provider("k"));
    let mut went = 0;
    let mut waits = Vec::new();
    for _ in 0..25 {
        match gate.reserve(&ask(1, 1)).await {
            Admit::Go(_) => went += 1,
            Admit::Wait { after, reason } => waits.push((after, reason)),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(went, 10);
    assert_eq!(waits.len(), 15);
    assert!(
        waits
            .iter()
            .all(|(after, r)| *r == "rpm" && *after <= Duration::from_millis(1050))
    );
    // A model the glob does not match, and another key, are not limited by it.
    let other = CallAsk {
        model: "o3",
        ..ask(1, 1)
    };
    assert!(matches!(gate.reserve(&other).await, Admit::Go(_)));
    let gate2 = limiter(&server, &rules)
        .await
        .for_session("t", &provider("k2"));
    assert!(matches!(gate2.reserve(&ask(1, 1)).await, Admit::Go(_)));
}

#[tokio::test]
async fn a_dead_workers_reservation_expires() {
    let server = RedisServer::start().unwrap();
    let rules = [limit(
        "provider = \"openai\"\nconcurrency = 1\nreservation_ttl_secs = 1",
    )];
    let dead = limiter(&server, &rules)
        .await
        .for_session("t", &provider("k"));
    // Reserved and never settled: its worker died mid-call.
    let Admit::Go(_) = dead.reserve(&ask(1, 1)).await else {
        panic!()
    };
    drop(dead);
    let other = limiter(&server, &rules)
        .await
        .for_session("t", &provider("k"));
    assert!(matches!(
        other.reserve(&ask(1, 1)).await,
        Admit::Wait {
            reason: "concurrency",
            ..
        }
    ));
    // Once the reservation's life is over the slot is free for another session.
    let p = admitted(&*other, &ask(1, 1)).await;
    assert!(!p.id.is_empty());
    other.settle(&ask(1, 1), p, &CallReport::default()).await;
    let mut conn = raw(&server).await;
    for _ in 0..200 {
        if read_state(&mut conn).await.unwrap().rules[0].in_flight == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the slot was not released");
}

#[tokio::test]
async fn tokens_are_reserved_then_corrected_by_the_usage() {
    let server = RedisServer::start().unwrap();
    let rules = [limit("provider = \"openai\"\ntpm = 600")];
    let gate = limiter(&server, &rules)
        .await
        .for_session("t", &provider("k"));
    let a = ask(100, 400);
    let Admit::Go(p) = gate.reserve(&a).await else {
        panic!()
    };
    assert_eq!(p.reserved_tokens, 500);
    assert!(matches!(
        gate.reserve(&a).await,
        Admit::Wait { reason: "tpm", .. }
    ));
    let used = CallReport {
        usage: Some(Usage {
            input_tokens: 60,
            output_tokens: 40,
            ..Default::default()
        }),
        ..Default::default()
    };
    gate.settle(&a, p, &used).await;
    // 100 spent of 600: the next call fits, with its output estimated from what the
    // model wrote before (40, with headroom) rather than its max_tokens.
    let mut conn = raw(&server).await;
    for _ in 0..200 {
        if read_state(&mut conn).await.unwrap().rules[0].tokens == 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let Admit::Go(p) = gate.reserve(&a).await else {
        panic!("the corrected window has room")
    };
    assert_eq!(p.reserved_tokens, 100 + 40 * 3 / 2 + 16);
    // A call larger than the whole allowance still goes, alone, into an empty window,
    // instead of waiting forever; here the window is not empty.
    assert!(matches!(
        gate.reserve(&ask(10_000, 1)).await,
        Admit::Wait { reason: "tpm", .. }
    ));
}

#[tokio::test]
async fn a_429_holds_the_key_on_every_worker_and_no_other_key() {
    let server = RedisServer::start().unwrap();
    // Nothing configured: only what the provider says.
    let w1 = limiter(&server, &[]).await;
    let w2 = limiter(&server, &[]).await;
    let on_w1 = w1.for_session("t", &provider("k"));
    let on_w2 = w2.for_session("t", &provider("k"));
    let other_key = w2.for_session("t", &provider("another-key"));
    let a = ask(10, 10);
    let Admit::Go(p) = on_w1.reserve(&a).await else {
        panic!()
    };
    // Nothing known of the key: this call probes it, with no round trip.
    assert_eq!(p.reserved_tokens, 0);
    on_w1
        .settle(
            &a,
            p,
            &CallReport {
                rate_limited: Some(Some(Duration::from_secs(30))),
                ..Default::default()
            },
        )
        .await;
    // At once on the worker that was refused.
    assert!(matches!(
        on_w1.reserve(&a).await,
        Admit::Wait { reason: "provider", after } if after > Duration::from_secs(29)
    ));
    // Within a refresh on the other worker.
    let mut held = false;
    for _ in 0..100 {
        if let Admit::Wait { reason, after } = on_w2.reserve(&a).await {
            assert_eq!(reason, "provider");
            // (It may first have waited out its own probe, which nothing answers here.)
            assert!(after > Duration::from_secs(20) && after <= Duration::from_secs(31));
            held = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(held, "the second worker never saw the hold");
    assert!(matches!(other_key.reserve(&a).await, Admit::Go(_)));
    // The admin view shows it.
    let state = read_state(&mut raw(&server).await).await.unwrap();
    assert_eq!(state.holds.len(), 1);
    assert!(state.holds[0].key.ends_with("|gpt-4o"));
    assert!(
        !state.holds[0].key.contains("k|"),
        "the key itself is never shown"
    );

    // A 2xx answer announcing a spent window holds the key too.
    let spent = CallReport {
        limits: Some(RateLimitInfo {
            remaining_tokens: Some(0),
            reset_tokens: Some(Duration::from_secs(20)),
            ..Default::default()
        }),
        ..Default::default()
    };
    other_key.settle(&a, Permit::default(), &spent).await;
    assert!(matches!(
        other_key.reserve(&a).await,
        Admit::Wait {
            reason: "provider",
            ..
        }
    ));
}

/// `on_unavailable = "open"`, said explicitly: a limiter that cannot reach Redis lets
/// calls through (and counts it). The default, closed, is `limiter_cluster.rs`'s.
#[tokio::test]
async fn redis_gone_lets_calls_through_when_open() {
    let mut server = RedisServer::start().unwrap();
    let rules = [limit("provider = \"openai\"\nrpm = 1")];
    let open = agentq_core::config::LimiterSection {
        on_unavailable: agentq_core::config::OnUnavailable::Open,
    };
    let gate = Limiter::connect_with(
        &server.url(),
        false,
        &open,
        &rules,
        CancellationToken::new(),
    )
    .await
    .unwrap()
    .for_session("t", &provider("k"));
    assert!(matches!(gate.reserve(&ask(1, 1)).await, Admit::Go(_)));
    assert!(matches!(gate.reserve(&ask(1, 1)).await, Admit::Wait { .. }));
    let errors = agentq_core::metrics::global().limiter_errors.get();
    server.kill();
    for _ in 0..3 {
        assert!(matches!(gate.reserve(&ask(1, 1)).await, Admit::Go(p) if p.id.is_empty()));
    }
    assert!(agentq_core::metrics::global().limiter_errors.get() >= errors + 3);
}

#[tokio::test]
async fn what_a_key_announces_paces_it_and_a_quiet_key_costs_nothing() {
    let server = RedisServer::start().unwrap();
    let w1 = limiter(&server, &[]).await;
    let w2 = limiter(&server, &[]).await;
    let on_w1 = w1.for_session("t", &provider("k"));
    let on_w2 = w2.for_session("t", &provider("k"));
    let a = ask(10, 10);
    // The first call probes; a second one on the same worker waits for its answer.
    let Admit::Go(probe) = on_w1.reserve(&a).await else {
        panic!()
    };
    let waiter = {
        let on_w1 = on_w1.clone();
        tokio::spawn(async move { on_w1.reserve(&ask(10, 10)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "waits for the probe's answer");
    let announced = CallReport {
        usage: Some(Usage::default()),
        limits: Some(RateLimitInfo {
            limit_requests: Some(40),
            remaining_requests: Some(3),
            reset_requests: Some(Duration::from_secs(30)),
            ..Default::default()
        }),
        ..Default::default()
    };
    on_w1.settle(&a, probe, &announced).await;
    assert!(matches!(waiter.await.unwrap(), Admit::Go(_)), "1 of 3 left");
    // The other worker learns it within a refresh; together they take the 2 left.
    let mut went = 1;
    let mut waited = false;
    for _ in 0..200 {
        match on_w2.reserve(&a).await {
            Admit::Go(_) if went < 3 => went += 1,
            Admit::Go(_) => panic!("more calls than the provider said were left"),
            Admit::Wait { reason, after } => {
                if went == 3 {
                    assert_eq!(reason, "provider");
                    // Until the reset (less the while this worker waited out its own
                    // probe, which nothing answers here).
                    assert!(after > Duration::from_secs(20), "{after:?}");
                    waited = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(waited && went == 3, "went {went}");

    // A key whose answers say nothing of limits: after its probe, no waits, no counts.
    let quiet = w1.for_session("t", &provider("local"));
    let Admit::Go(probe) = quiet.reserve(&a).await else {
        panic!()
    };
    quiet
        .settle(
            &a,
            probe,
            &CallReport {
                usage: Some(Usage::default()),
                ..Default::default()
            },
        )
        .await;
    for _ in 0..50 {
        assert!(matches!(quiet.reserve(&a).await, Admit::Go(p) if p.id.is_empty()));
    }
}

/// Script calls (round trips of the limiter) the server has run so far.
async fn script_calls(conn: &mut redis::aio::ConnectionManager) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .unwrap();
    agentq_testkit::services::command_calls(&info)
        .into_iter()
        .filter(|(name, _)| name.starts_with("eval"))
        .map(|(_, calls)| calls)
        .sum()
}

#[tokio::test]
async fn a_full_window_books_the_next_start_and_the_call_asks_once() {
    let server = RedisServer::start().unwrap();
    // 10 per one-second window (1050 ms with its arrival guard).
    let rules = [limit("provider = \"openai\"\nrpm = 600\nwindow_secs = 1")];
    let l = limiter(&server, &rules).await;
    let gate = l.for_session("t", &provider("k"));
    let mut conn = raw(&server).await;
    let a = CallAsk {
        max_wait: Duration::from_millis(2_000),
        ..ask(1, 1)
    };
    let before = script_calls(&mut conn).await;
    let mut starts = Vec::new();
    let mut refused = None;
    for _ in 0..25 {
        match gate.reserve(&a).await {
            Admit::Go(p) => starts.push((p.start_after, p.waits_for)),
            Admit::Wait { after, reason } => {
                refused = Some((after, reason));
                break;
            }
            Admit::Exhausted { message, .. } => panic!("{message}"),
            Admit::Children { .. } => panic!("the limiter keeps no budget"),
        }
    }
    // Ten now, ten booked a window later; the next would wait past what the call takes,
    // so it is told to wait (and nothing is booked for it).
    assert_eq!(starts.len(), 20, "{starts:?}");
    assert!(
        starts[..10]
            .iter()
            .all(|(d, w)| d.is_zero() && w.is_empty())
    );
    assert!(
        starts[10..]
            .iter()
            .all(|(d, w)| *d > Duration::from_millis(900)
                && *d <= Duration::from_millis(1050)
                && *w == "rpm"),
        "{starts:?}"
    );
    let (after, reason) = refused.expect("the third window is past max_wait");
    assert_eq!(reason, "rpm");
    assert!(after > Duration::from_millis(2_000), "{after:?}");
    // One round trip per call, the refused one included (and the first: the script was
    // loaded when the limiter connected).
    assert_eq!(script_calls(&mut conn).await - before, 21);
    let state = read_state(&mut conn).await.unwrap();
    assert_eq!(state.rules[0].requests, 20, "the refusal booked nothing");
}

/// The one rule's counts as the admin view reads them: requests and tokens in its
/// window (bookings included), calls in flight.
async fn rule_counts(conn: &mut redis::aio::ConnectionManager) -> (u64, i64, u64) {
    let state = read_state(conn).await.unwrap();
    let r = &state.rules[0];
    (r.requests, r.tokens, r.in_flight)
}

/// A call that never went out (cancelled before its booked start, refused by the budget
/// after the limiter, or too late for its booking) gives its place in the windows back:
/// requests and tokens as if it had never been booked, carried by the next round trip.
#[tokio::test]
async fn a_booking_given_back_unsent_leaves_the_windows_as_if_never_made() {
    let server = RedisServer::start().unwrap();
    // 2 requests and 1000 tokens per one-second window; calls in flight counted too.
    let rules = [limit(
        "provider = \"openai\"\nrpm = 120\ntpm = 60000\nconcurrency = 10\nwindow_secs = 1",
    )];
    let l = limiter(&server, &rules).await;
    let gate = l.for_session("t", &provider("k"));
    let mut conn = raw(&server).await;
    let a = CallAsk {
        max_wait: Duration::from_secs(5),
        ..ask(100, 100)
    };
    let go = |admit: Admit| match admit {
        Admit::Go(p) => p,
        other => panic!("{other:?}"),
    };
    let before = tokio::time::Instant::now();
    let first = go(gate.reserve(&a).await);
    let after = tokio::time::Instant::now();
    let second = go(gate.reserve(&a).await);
    let booked = go(gate.reserve(&a).await);
    assert!(first.start_after.is_zero() && second.start_after.is_zero());
    assert!(
        booked.start_after > Duration::from_millis(900),
        "{booked:?}"
    );
    // It may start up to half the arrival guard of a one-second window (50 ms) after
    // its booked start, counted from when the limiter was asked.
    let by = first.start_by.expect("a rule of requests bounds the start");
    let late = Duration::from_millis(25);
    assert!(by >= before + late && by <= after + late, "{first:?}");
    let by = booked
        .start_by
        .expect("a rule of requests bounds the start");
    assert!(by >= before + booked.start_after + late, "{booked:?}");
    assert_eq!(
        rule_counts(&mut conn).await,
        (3, 600, 3),
        "the counts include the booked call"
    );

    gate.settle(&a, booked, &CallReport::UNSENT).await;
    // The settlement waits for the next round trip: this reservation carries it, and
    // the place it gave back is this call's, not one a window later.
    let again = go(gate.reserve(&a).await);
    assert!(
        again.start_after > Duration::from_millis(900)
            && again.start_after <= Duration::from_millis(1050),
        "{again:?}"
    );
    assert_eq!(rule_counts(&mut conn).await, (3, 600, 3));

    // A settled call that was sent keeps its place: only the slot in flight goes.
    gate.settle(&a, first, &CallReport::default()).await;
    gate.settle(&a, second, &CallReport::UNSENT).await;
    gate.settle(&a, again, &CallReport::UNSENT).await;
    // A call larger than the window's tokens, taking no wait: refused, it books nothing
    // and carries the settlements.
    let too_big = CallAsk {
        max_wait: Duration::ZERO,
        ..ask(1_000, 1_000)
    };
    assert!(matches!(gate.reserve(&too_big).await, Admit::Wait { .. }));
    assert_eq!(rule_counts(&mut conn).await, (1, 200, 0));
    let rule_keys: Vec<String> = redis::cmd("SMEMBERS")
        .arg("agentq:{limit}:keys")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(rule_keys.len(), 1);
    let tokens: i64 = redis::cmd("HLEN")
        .arg(format!("{}:tk", rule_keys[0]))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(tokens, 1, "the token records of unsent calls are gone");
}

#[tokio::test]
async fn a_settlement_rides_on_the_next_reservation() {
    let server = RedisServer::start().unwrap();
    let rules = [limit("provider = \"openai\"\ntpm = 100000")];
    let l = limiter(&server, &rules).await;
    let gate = l.for_session("t", &provider("k"));
    let mut conn = raw(&server).await;
    let a = ask(100, 400);
    let used = CallReport {
        usage: Some(Usage {
            input_tokens: 60,
            output_tokens: 40,
            ..Default::default()
        }),
        ..Default::default()
    };
    let before = script_calls(&mut conn).await;
    let started = std::time::Instant::now();
    for _ in 0..20 {
        let Admit::Go(p) = gate.reserve(&a).await else {
            panic!()
        };
        gate.settle(&a, p, &used).await;
    }
    // Twenty calls, twenty round trips: each reservation carried the settlement before
    // it, and the last is written on its own once no reservation came for it. The
    // writer also sends, at most once a second, what no reservation took in that time
    // (none here, unless the loop itself took that long). The script was loaded when the
    // limiter connected: no call pays for that.
    let slack = u64::try_from(started.elapsed().as_millis() / 1000).unwrap();
    let calls = script_calls(&mut conn).await - before;
    assert!((20..=20 + slack).contains(&calls), "{calls} round trips");
    for _ in 0..200 {
        if read_state(&mut conn).await.unwrap().rules[0].tokens == 20 * 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(read_state(&mut conn).await.unwrap().rules[0].tokens, 2_000);
    let calls = script_calls(&mut conn).await - before;
    assert!((21..=21 + slack).contains(&calls), "{calls} round trips");
}

#[tokio::test]
async fn a_call_longer_than_its_reservation_keeps_its_slot() {
    let server = RedisServer::start().unwrap();
    let rules = [limit(
        "provider = \"openai\"\nconcurrency = 1\nreservation_ttl_secs = 1",
    )];
    let w1 = limiter(&server, &rules)
        .await
        .for_session("t", &provider("k"));
    let w2 = limiter(&server, &rules)
        .await
        .for_session("t", &provider("k"));
    let long = admitted(&*w1, &ask(1, 1)).await;
    // Three reservation lives later the call still runs, and still holds the slot.
    for _ in 0..30 {
        assert!(
            matches!(
                w2.reserve(&ask(1, 1)).await,
                Admit::Wait {
                    reason: "concurrency",
                    ..
                }
            ),
            "the running call's slot expired under it"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Settled: the slot is given back at once (the rule is full, so it is not deferred).
    w1.settle(&ask(1, 1), long, &CallReport::default()).await;
    let mut got = false;
    for _ in 0..50 {
        if let Admit::Go(p) = w2.reserve(&ask(1, 1)).await {
            assert!(!p.id.is_empty());
            got = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(got, "the slot was not given back");
}

/// A session names its model, so a caller can name a new one on every call: the
/// limiter's per-model records in Redis (learned averages, holds, what was announced)
/// stay within `MAX_FIELDS` however many models are named, keeping the ones settled
/// most recently.
#[tokio::test]
async fn naming_ten_thousand_models_keeps_the_per_model_hashes_bounded() {
    use agentq_core::admission::{FIELDS_KEY, HOLDS_KEY, MAX_FIELDS};

    let server = RedisServer::start().unwrap();
    let rules = [limit("provider = \"openai\"\nmodel = \"*\"\nrpm = 1000000")];
    let w = limiter(&server, &rules)
        .await
        .for_session("t", &provider("k"));
    let report = CallReport {
        usage: Some(Usage {
            input_tokens: 3,
            output_tokens: 5,
            ..Default::default()
        }),
        rate_limited: Some(Some(Duration::from_secs(60))),
        limits: Some(RateLimitInfo {
            limit_requests: Some(100),
            remaining_requests: Some(5),
            reset_requests: Some(Duration::from_secs(60)),
            ..Default::default()
        }),
        unsent: false,
    };
    let n = 10_000;
    for i in 0..n {
        let model = format!("made-up-{i}");
        let a = CallAsk {
            model: &model,
            input_tokens: 3,
            max_output_tokens: 5,
            web_searches: 0,
            max_wait: Duration::ZERO,
        };
        let p = admitted(&*w, &a).await;
        w.settle(&a, p, &report).await;
    }
    let mut conn = raw(&server).await;
    let hashes = [
        HOLDS_KEY,
        "agentq:{limit}:avg",
        "agentq:{limit}:holds:announced",
    ];
    let last = format!("|made-up-{}", n - 1);
    // The last settlement is written off the call path: wait for it (bounded).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let keys: Vec<String> = redis::cmd("HKEYS")
            .arg("agentq:{limit}:avg")
            .query_async(&mut conn)
            .await
            .unwrap();
        if keys.iter().any(|k| k.ends_with(&last)) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the last settlement never arrived"
        );
        tokio::task::yield_now().await;
    }
    for h in hashes.iter().chain([&FIELDS_KEY]) {
        let len: usize = redis::cmd(if *h == FIELDS_KEY { "ZCARD" } else { "HLEN" })
            .arg(*h)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(len <= MAX_FIELDS, "{h} holds {len} fields");
        assert!(len >= MAX_FIELDS / 2, "{h} holds only {len} fields");
    }
    // The most recent models are the ones kept.
    for h in hashes {
        let keys: Vec<String> = redis::cmd("HKEYS")
            .arg(h)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(keys.iter().any(|k| k.ends_with(&last)), "{h}");
        assert!(!keys.iter().any(|k| k.ends_with("|made-up-0")), "{h}");
    }
    // Nothing else per model outlives the bound either.
    let per_model: Vec<String> = redis::cmd("KEYS")
        .arg("agentq:{limit}:announced|*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(per_model.len() <= MAX_FIELDS, "{}", per_model.len());
}
