#![allow(clippy::unwrap_used, clippy::expect_used)]

//! The loop's decisions, made by the pure state machine without any I/O: each test builds
//! a state, asks for the next step (or feeds a step's results back) and checks what the
//! driver would be told to do.

use agentq_agent::driver::{BackgroundResult, SuspendReason};
use agentq_agent::schema::{FinishReason, Message, Role, ToolCall};
use agentq_agent::spec::{ExitReason, Mode, SessionSpec, WebSearch};
use agentq_agent::state::{
    AfterTools, CANCELLED_RESULT, Drain, INTERRUPTED_BY_USER_RESULT, Outcome, PLAN_TO_ACT, Phase,
    SessionState, Step, Stuck,
};
use chrono::Utc;
use serde_json::json;

fn state(mode: Mode) -> SessionState {
    let mut spec = SessionSpec::new("do the task");
    spec.mode = mode;
    SessionState::new("s", spec)
}

fn call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "echo".into(),
        arguments: json!({}).into(),
    }
}

fn with_calls(ids: &[&str]) -> Message {
    let mut m = Message::assistant("");
    m.tool_calls = ids.iter().map(|id| call(id)).collect();
    m
}

fn result(i: u64) -> BackgroundResult {
    BackgroundResult {
        label: format!("job{i}"),
        id: format!("id{i}"),
        outcome: "completed".into(),
        result: format!("result {i}"),
        seq: i,
    }
}

fn step(s: &SessionState) -> Step {
    s.decide(Utc::now(), false)
}

fn stop(answer: &str) -> Outcome {
    Outcome {
        reason: ExitReason::Stop,
        result: Some(answer.into()),
        error: None,
    }
}

#[test]
fn a_fresh_session_calls_the_model_and_next_step_is_decide_uncancelled() {
    let s = state(Mode::Act);
    assert_eq!(step(&s), Step::CallLlm);
    assert_eq!(s.next_step(Utc::now()), Step::CallLlm);
    assert_eq!(s.decide(Utc::now(), true), Step::Cancel);
}

#[test]
fn an_outcome_is_final() {
    let mut s = state(Mode::Act);
    s.push_assistant(with_calls(&["a"]));
    s.outcome = Some(Outcome::error("boom"));
    assert_eq!(
        s.decide(Utc::now(), true),
        Step::Done(Outcome::error("boom"))
    );
}

#[test]
fn pending_calls_run_in_act_mode_unless_cancelled() {
    let mut s = state(Mode::Act);
    s.push_assistant(with_calls(&["a", "b"]));
    assert_eq!(step(&s), Step::RunTools(vec![call("a"), call("b")]));
    s.messages
        .push(Message::tool_result("a", "echo", "ok", false));
    assert_eq!(step(&s), Step::RunTools(vec![call("b")]));
    assert_eq!(s.decide(Utc::now(), true), Step::Cancel);
}

#[test]
fn cancel_closes_the_open_calls_and_interrupts() {
    let mut s = state(Mode::Act);
    s.push_assistant(with_calls(&["a", "b"]));
    s.messages
        .push(Message::tool_result("a", "echo", "ok", false));
    s.cancel();
    assert_eq!(s.outcome, Some(Outcome::new(ExitReason::Interrupted)));
    let last = s.messages.last().unwrap();
    assert_eq!(last.tool_call_id.as_deref(), Some("b"));
    assert_eq!(last.content, CANCELLED_RESULT);
    assert!(last.is_error);
    assert!(s.pending_calls().is_empty());
    assert_eq!(step(&s), Step::Done(Outcome::new(ExitReason::Interrupted)));
}

#[test]
fn calls_in_modes_without_tools_are_refused_even_when_cancelled() {
    for (mode, phase, named) in [
        (Mode::Think, Phase::Act, "think mode"),
        (Mode::Plan, Phase::Act, "plan mode"),
        (Mode::PlanAct, Phase::Plan, "the plan phase"),
    ] {
        let mut s = state(mode);
        s.phase = phase;
        s.push_assistant(with_calls(&["a", "b"]));
        let expected = Step::RefuseTools(vec![call("a"), call("b")]);
        assert_eq!(step(&s), expected, "{mode}");
        assert_eq!(s.decide(Utc::now(), true), expected, "{mode}");
        let Step::RefuseTools(calls) = expected else {
            unreachable!()
        };
        s.refuse_calls(calls);
        let refusals = &s.messages[2..];
        assert_eq!(refusals.len(), 2);
        for (r, id) in refusals.iter().zip(["a", "b"]) {
            assert_eq!(r.role, Role::Tool);
            assert_eq!(r.tool_call_id.as_deref(), Some(id));
            assert_eq!(r.name.as_deref(), Some("echo"));
            assert!(r.is_error);
            assert_eq!(
                r.content,
                format!(
                    "Tool calls are not available in {named}: `echo` was not run. Answer without tools."
                )
            );
        }
        // Refused, the model is asked again (without tools).
        assert_eq!(step(&s), Step::CallLlm, "{mode}");
    }
}

#[test]
fn the_plan_of_a_plan_act_session_starts_the_act_phase() {
    let mut s = state(Mode::PlanAct);
    assert_eq!(s.phase, Phase::Plan);
    assert!(!s.tools_enabled());
    s.push_assistant(Message::assistant("1. do it"));
    // The plan is in: settled before a cancel is looked at.
    assert_eq!(s.decide(Utc::now(), true), Step::StartAct);
    s.start_act();
    assert_eq!(s.phase, Phase::Act);
    assert!(s.tools_enabled());
    let last = s.messages.last().unwrap();
    assert_eq!(
        (last.role, last.content.as_str()),
        (Role::User, PLAN_TO_ACT)
    );
    assert_eq!(step(&s), Step::CallLlm);
    // The act phase's answer is a final answer.
    s.push_assistant(Message::assistant("done"));
    assert_eq!(step(&s), Step::DrainBackground);
}

#[test]
fn a_final_answer_drains_background_results_then_finishes() {
    let mut s = state(Mode::Act);
    s.push_assistant(Message::assistant("answer"));
    assert_eq!(s.decide(Utc::now(), true), Step::DrainBackground);

    assert_eq!(s.drain(&[result(4), result(2)]), Drain::Injected);
    assert_eq!(
        (s.drain_rounds, s.free_iteration, s.bg_cursor),
        (1, true, 4)
    );
    let injected = s.messages.last().unwrap();
    assert_eq!(injected.role, Role::User);
    assert_eq!(
        injected.content,
        "[Background agent \"job4\" (id4) completed] result 4\n\n\
         [Background agent \"job2\" (id2) completed] result 2"
    );
    assert!(s.outcome.is_none());
    assert_eq!(step(&s), Step::CallLlm);

    // The answer to the results does not count as an iteration.
    s.push_assistant(Message::assistant("second answer"));
    assert_eq!(s.iteration, 1);
    assert_eq!(step(&s), Step::DrainBackground);
    assert_eq!(s.drain(&[]), Drain::Finished(stop("second answer")));
    assert_eq!(s.outcome, Some(stop("second answer")));
    assert_eq!(step(&s), Step::Done(stop("second answer")));
}

#[test]
fn drains_stop_after_max_background_drain_rounds() {
    let mut s = state(Mode::Act);
    s.spec.max_background_drain_rounds = 3;
    let mut llm_calls = 0;
    let mut seq = 0;
    let outcome = loop {
        match step(&s) {
            Step::CallLlm => {
                llm_calls += 1;
                s.push_assistant(Message::assistant(format!("answer {llm_calls}")));
            }
            Step::DrainBackground => {
                seq += 1;
                assert_eq!(s.drain(&[result(seq)]), Drain::Injected);
            }
            Step::Done(o) => break o,
            other => panic!("unexpected {other:?}"),
        }
    };
    // 1 answer + 3 drains, the fourth answer stands although results keep coming.
    assert_eq!(llm_calls, 4);
    assert_eq!(s.iteration, 1);
    assert_eq!(s.bg_cursor, 3);
    assert_eq!(outcome, stop("answer 4"));
}

#[test]
fn a_real_tool_call_resets_the_drain_count() {
    let mut s = state(Mode::Act);
    s.spec.max_background_drain_rounds = 1;
    s.push_assistant(Message::assistant("a1"));
    assert_eq!(s.drain(&[result(1)]), Drain::Injected);
    s.push_assistant(Message::assistant("a2"));
    assert_eq!(step(&s), Step::Done(stop("a2")));

    let mut s = state(Mode::Act);
    s.spec.max_background_drain_rounds = 1;
    s.push_assistant(Message::assistant("a1"));
    assert_eq!(s.drain(&[result(1)]), Drain::Injected);
    s.push_assistant(with_calls(&["c"]));
    assert_eq!(s.drain_rounds, 0);
    s.push_tool_result(call("c"), "ok".into(), false);
    assert_eq!(step(&s), Step::CallLlm);
    s.push_assistant(Message::assistant("a2"));
    assert_eq!(step(&s), Step::DrainBackground);
}

#[test]
fn running_children_the_host_cannot_wait_for_suspend_or_end_a_cancelled_run() {
    let mut s = state(Mode::Act);
    s.push_assistant(Message::assistant("answer"));
    assert_eq!(
        s.drain_unavailable(false),
        Drain::Suspended(SuspendReason::Children)
    );
    assert!(s.outcome.is_none());
    // Resumed later, the answer is still to be settled.
    assert_eq!(step(&s), Step::DrainBackground);
    assert_eq!(
        s.drain_unavailable(true),
        Drain::Finished(Outcome::new(ExitReason::Interrupted))
    );
    assert_eq!(s.outcome, Some(Outcome::new(ExitReason::Interrupted)));
}

#[test]
fn a_tool_round_ends_in_suspension_then_cancel_then_yield() {
    let round = |s: &mut SessionState| {
        s.push_assistant(with_calls(&["a", "b"]));
        // Finished in the other order; stored in call order.
        s.push_tool_result(call("b"), "handing over".into(), false);
        s.push_tool_result(call("a"), "ok".into(), false);
    };
    let yielded = || Some("handing over".to_string());

    let mut s = state(Mode::Act);
    round(&mut s);
    let approval = SuspendReason::Approval {
        tool_call_id: "x".into(),
    };
    assert_eq!(
        s.end_tool_round(Some(approval.clone()), yielded(), true),
        AfterTools::Suspend(approval)
    );
    assert!(s.outcome.is_none());
    let ids: Vec<_> = s.messages[2..]
        .iter()
        .map(|m| m.tool_call_id.clone().unwrap())
        .collect();
    assert_eq!(ids, ["a", "b"]);

    let mut s = state(Mode::Act);
    round(&mut s);
    assert_eq!(
        s.end_tool_round(None, yielded(), true),
        AfterTools::Continue
    );
    assert!(s.outcome.is_none(), "a cancel is closed by the next step");
    assert_eq!(s.decide(Utc::now(), true), Step::Cancel);

    let mut s = state(Mode::Act);
    round(&mut s);
    let outcome = Outcome {
        reason: ExitReason::Yielded,
        result: yielded(),
        error: None,
    };
    assert_eq!(
        s.end_tool_round(None, yielded(), false),
        AfterTools::Finished(outcome.clone())
    );
    assert_eq!(s.outcome, Some(outcome.clone()));
    assert_eq!(step(&s), Step::Done(outcome));

    let mut s = state(Mode::Act);
    round(&mut s);
    assert_eq!(s.end_tool_round(None, None, false), AfterTools::Continue);
    assert_eq!(step(&s), Step::CallLlm);
}

#[test]
fn approvals_and_interrupts_track_which_calls_never_started() {
    let mut s = state(Mode::Act);
    s.push_assistant(with_calls(&["a", "b"]));
    s.hold_for_approval("a");
    s.hold_for_approval("a");
    s.hold_for_approval("b");
    assert_eq!(s.not_started, ["a", "b"]);
    s.push_tool_result(call("a"), "ok".into(), false);
    assert_eq!(s.not_started, ["b"]);
    s.interrupt_tools();
    assert!(s.not_started.is_empty());
    let last = s.messages.last().unwrap();
    assert_eq!(last.tool_call_id.as_deref(), Some("b"));
    assert_eq!(last.content, INTERRUPTED_BY_USER_RESULT);
    // An interrupt does not end the session.
    assert!(s.outcome.is_none());
    assert_eq!(step(&s), Step::CallLlm);
}

#[test]
fn an_llm_call_that_ends_the_session_closes_calls_only_when_cancelled() {
    let mut s = state(Mode::Act);
    s.push_assistant(with_calls(&["a"]));
    s.end_with(Outcome::error("LLM call failed"));
    assert_eq!(s.pending_calls(), vec![call("a")]);
    assert_eq!(s.outcome, Some(Outcome::error("LLM call failed")));

    let mut s = state(Mode::Act);
    s.push_assistant(with_calls(&["a"]));
    s.end_with(Outcome::new(ExitReason::Interrupted));
    assert!(s.pending_calls().is_empty());
    assert_eq!(s.messages.last().unwrap().content, CANCELLED_RESULT);
}

#[test]
fn steering_messages_and_late_background_results_are_recorded_with_their_positions() {
    let mut s = state(Mode::Act);
    assert!(!s.inject_messages(Vec::new()));
    assert!(s.inject_messages(vec![(7, "also this".into()), (5, "and that".into())]));
    assert_eq!(s.msg_cursor, 7);
    let texts: Vec<_> = s.messages[1..].iter().map(|m| m.content.as_str()).collect();
    assert_eq!(texts, ["also this", "and that"]);

    let before = s.messages.len();
    s.deliver_background(&[]);
    assert_eq!(s.messages.len(), before);
    s.deliver_background(&[result(9)]);
    assert_eq!(s.bg_cursor, 9);
    // Delivered after a tool round, results are no drain: nothing is free.
    assert_eq!((s.drain_rounds, s.free_iteration), (0, false));
}

#[test]
fn limits_end_the_session_before_another_call() {
    let mut s = state(Mode::Act);
    s.spec.max_iterations = 1;
    s.push_assistant(with_calls(&["a"]));
    s.push_tool_result(call("a"), "ok".into(), false);
    assert!(matches!(
        step(&s),
        Step::Done(Outcome {
            reason: ExitReason::MaxIterations,
            ..
        })
    ));
    // A drain's answer is free, so the limit does not apply to it.
    s.free_iteration = true;
    assert_eq!(step(&s), Step::CallLlm);
}

/// A session timeout too large for any clock (a row written before the API bounded it, or
/// inserted directly) is taken as "no deadline in any lifetime": deciding never panics,
/// the session calls the model, and its deadline is far off but representable.
#[test]
fn a_timeout_beyond_the_clock_does_not_panic() {
    for secs in [9_000_000_000_000_000, i64::MAX as u64, u64::MAX] {
        let mut s = state(Mode::Act);
        s.spec.timeout_secs = Some(secs);
        s.started_at = Some(Utc::now());
        assert_eq!(step(&s), Step::CallLlm, "timeout_secs {secs}");
        let d = s.deadline().expect("a deadline");
        assert!(d > Utc::now() + chrono::Duration::days(365 * 50), "{d}");
    }
    // A start at the far end of the calendar cannot overflow either.
    let mut s = state(Mode::Act);
    s.spec.timeout_secs = Some(60);
    s.started_at = Some(chrono::DateTime::<Utc>::MAX_UTC);
    assert_eq!(step(&s), Step::CallLlm);
}

/// Usage a provider reports is counted saturating, within what a store holds: a model
/// claiming `u64::MAX` tokens twice neither overflows nor makes the state unstorable.
#[test]
fn reported_usage_saturates() {
    let mut s = state(Mode::Act);
    s.spec.token_budget = Some(1_000);
    for _ in 0..2 {
        let mut m = with_calls(&["a"]);
        m.usage = Some(agentq_agent::schema::Usage {
            input_tokens: u64::MAX,
            output_tokens: u64::MAX,
            ..Default::default()
        });
        s.push_assistant(m);
    }
    assert_eq!(s.usage.input_tokens, i64::MAX as u64);
    assert_eq!(s.usage.total(), 2 * (i64::MAX as u64));
}

/// A response of more calls than one round runs (a model looping on calls, or told to
/// make thousands): those past the limit are refused, in order, before any runs, and the
/// rest run as usual.
#[test]
fn calls_past_the_per_response_limit_are_refused_first() {
    let max = agentq_agent::bounds::MAX_TOOL_CALLS_PER_RESPONSE;
    let ids: Vec<String> = (0..max + 3).map(|i| format!("c{i}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut s = state(Mode::Act);
    s.push_assistant(with_calls(&refs));
    let excess: Vec<ToolCall> = refs[max..].iter().map(|id| call(id)).collect();
    assert_eq!(step(&s), Step::RefuseExcessCalls(excess.clone()));
    s.refuse_excess_calls(excess);
    let last = s.messages.last().unwrap();
    assert_eq!(last.tool_call_id.as_deref(), Some(ids[max + 2].as_str()));
    assert!(last.is_error);
    assert!(last.content.contains(&max.to_string()), "{}", last.content);
    let run: Vec<ToolCall> = refs[..max].iter().map(|id| call(id)).collect();
    assert_eq!(step(&s), Step::RunTools(run));
}

// Repeated calls. A repeat is the same tool with equal arguments in consecutive answers,
// each answered with the same result; anything else in between (another call instead, a
// changed result, a user message) starts the count again.

fn read(id: &str, args: serde_json::Value) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "read_file".into(),
        arguments: args.into(),
    }
}

/// The model answers with `calls`; each gets `out` (with whatever note the state adds).
/// The notes the results got, one per call.
fn turn(s: &mut SessionState, calls: &[ToolCall], out: &str) -> Vec<String> {
    let mut m = Message::assistant("");
    m.tool_calls = calls.to_vec();
    s.push_assistant(m);
    assert_eq!(step(s), Step::RunTools(calls.to_vec()));
    calls
        .iter()
        .map(|c| {
            let content = s.with_repeat_note(c, out.to_string());
            s.push_tool_result(c.clone(), content.clone(), false);
            content.strip_prefix(out).unwrap().to_string()
        })
        .collect()
}

/// The same call, with a fresh id each time (as a model gives it).
fn notes_of_repeats(s: &mut SessionState, n: usize, out: &str) -> Vec<String> {
    (0..n)
        .map(|i| {
            turn(
                s,
                &[read(&format!("r{i}"), json!({"path": "notes.txt"}))],
                out,
            )
            .remove(0)
        })
        .collect()
}

#[test]
fn a_repeated_call_with_the_same_result_is_told_so_from_the_second_time() {
    let mut s = state(Mode::Act);
    assert_eq!(
        turn(
            &mut s,
            &[read("a", json!({"path": "n.txt", "limit": 5}))],
            "x"
        ),
        [""]
    );
    // Key order does not make another call.
    let note = turn(
        &mut s,
        &[read("b", json!({"limit": 5, "path": "n.txt"}))],
        "x",
    )
    .remove(0);
    assert!(
        note.contains("called `read_file` with these same arguments 2 times in a row")
            && note.contains("the result has not changed")
            && note.contains("ends as stuck if you make this same call 5 times in a row"),
        "{note}"
    );
    // The note a result carries is not part of it: the third is a repeat of the second.
    let note = turn(
        &mut s,
        &[read("c", json!({"path": "n.txt", "limit": 5}))],
        "x",
    )
    .remove(0);
    assert!(note.contains("3 times in a row"), "{note}");
}

#[test]
fn spelling_the_same_arguments_another_way_does_not_evade_the_count() {
    let mut s = state(Mode::Act);
    // Key order, spacing in the model's JSON text, and a number written as 5, 5.0 or
    // 5e0 are the same call to any tool that reads the arguments.
    let spellings = [
        r#"{"path": "n.txt", "opts": {"limit": 5, "deep": [1, 2.0]}}"#,
        r#"{"opts":{"deep":[1.0,2],"limit":5.0},"path":"n.txt"}"#,
        "{ \"opts\" : { \"limit\" : 5e0 , \"deep\" : [ 1 , 2 ] } ,\n \"path\" : \"n.txt\" }",
    ];
    let notes: Vec<String> = spellings
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            let args = ToolCall::parse_arguments(raw);
            turn(&mut s, &[read(&format!("r{i}"), args.value())], "x").remove(0)
        })
        .collect();
    assert_eq!(notes[0], "");
    assert!(notes[1].contains("2 times in a row"), "{notes:?}");
    assert!(notes[2].contains("3 times in a row"), "{notes:?}");
    // Numbers that differ, even past what a float holds exactly, are other calls.
    let big = |id: &str, n: u64| read(id, json!({"path": "n.txt", "offset": n}));
    turn(&mut s, &[big("b1", 9_007_199_254_740_992)], "x");
    assert_eq!(turn(&mut s, &[big("b2", 9_007_199_254_740_993)], "x"), [""]);
}

#[test]
fn other_arguments_another_tool_between_or_a_changed_result_start_the_count_again() {
    let mut s = state(Mode::Act);
    let a = || read("a", json!({"path": "a.txt"}));
    turn(&mut s, &[a()], "x");
    assert_eq!(
        turn(&mut s, &[read("b", json!({"path": "b.txt"}))], "x"),
        [""]
    );
    assert_eq!(turn(&mut s, &[a()], "x"), [""], "other arguments between");
    let write = ToolCall {
        id: "w".into(),
        name: "write_file".into(),
        arguments: json!({"path": "a.txt", "content": "y"}).into(),
    };
    turn(&mut s, &[write], "wrote");
    assert_eq!(
        turn(&mut s, &[a()], "y"),
        [""],
        "another tool between: a write-then-read is not a repeat"
    );
    assert_eq!(turn(&mut s, &[a()], "z"), [""], "the result changed");
    let note = turn(&mut s, &[a()], "z").remove(0);
    assert!(note.contains("2 times in a row"), "{note}");
    // A user message between (steering, a follow-up, a background result) is news.
    s.inject_messages(vec![(1, "look again".into())]);
    assert_eq!(turn(&mut s, &[a()], "z"), [""]);
}

#[test]
fn the_same_call_made_max_repeated_calls_times_ends_the_session_stuck_without_running() {
    let mut s = state(Mode::Act);
    assert_eq!(s.spec.max_repeated_calls, 5);
    let notes = notes_of_repeats(&mut s, 4, "same");
    assert_eq!(notes[0], "");
    for (i, n) in notes.iter().enumerate().skip(1) {
        assert!(n.contains(&format!("{} times in a row", i + 1)), "{n}");
    }
    // The fifth, beside a call that is new: the whole answer is refused.
    let fifth = read("r4", json!({"path": "notes.txt"}));
    let other = read("o", json!({"path": "other.txt"}));
    let mut m = Message::assistant("");
    m.tool_calls = vec![other.clone(), fifth.clone()];
    s.push_assistant(m);
    let expected = Stuck {
        calls: vec![other, fifth],
        tool: "read_file".into(),
        times: 5,
    };
    assert_eq!(step(&s), Step::Stuck(expected.clone()));
    // A cancel still wins: the run was asked to stop.
    assert_eq!(s.decide(Utc::now(), true), Step::Cancel);
    let before = s.messages.len();
    s.end_stuck(expected);
    assert!(s.pending_calls().is_empty(), "every call is answered");
    let answers = &s.messages[before..];
    assert_eq!(answers.len(), 2);
    assert!(
        answers.iter().all(|m| m.is_error
            && m.content
                .starts_with("Not run: `read_file` was called 5 times")),
        "{answers:?}"
    );
    let Step::Done(outcome) = step(&s) else {
        panic!("{:?}", step(&s))
    };
    assert_eq!(outcome.reason, ExitReason::Stuck);
    assert_eq!(outcome.reason.as_str(), "stuck");
    assert!(
        outcome
            .error
            .as_deref()
            .unwrap()
            .contains("`read_file` was called 5 times in a row"),
        "{outcome:?}"
    );
}

#[test]
fn a_session_rebuilt_from_its_messages_keeps_the_count() {
    let mut s = state(Mode::Act);
    notes_of_repeats(&mut s, 4, "same");
    // What a resumed run starts from: the spec and the stored messages, scalars aside.
    let stored = serde_json::to_string(&s.messages).unwrap();
    let mut resumed = SessionState::new("s", s.spec.clone());
    resumed.messages = serde_json::from_str(&stored).unwrap();
    let note = turn(
        &mut SessionState {
            messages: resumed.messages[..resumed.messages.len() - 2].to_vec(),
            ..resumed.clone()
        },
        &[read("again", json!({"path": "notes.txt"}))],
        "same",
    )
    .remove(0);
    assert!(note.contains("4 times in a row"), "{note}");
    // A crash after the fifth answer was committed, before its call ran: the resumed run
    // does not run it.
    let mut m = Message::assistant("");
    m.tool_calls = vec![read("r4", json!({"path": "notes.txt"}))];
    resumed.push_assistant(m);
    let mut again = SessionState::new("s", s.spec.clone());
    again.messages = resumed.messages.clone();
    assert!(
        matches!(step(&again), Step::Stuck(ref k) if k.times == 5),
        "{:?}",
        step(&again)
    );
}

#[test]
fn repeat_limits_can_be_turned_off_and_a_limit_of_one_counts_a_repeat() {
    let mut s = state(Mode::Act);
    s.spec.max_repeated_calls = 0;
    let notes = notes_of_repeats(&mut s, 8, "same");
    assert!(notes[7].contains("8 times in a row"), "{}", notes[7]);
    assert!(!notes[7].contains("session ends"), "{}", notes[7]);

    let mut s = state(Mode::Act);
    s.spec.max_repeated_calls = 0;
    s.spec.warn_repeated_calls = 0;
    assert!(
        notes_of_repeats(&mut s, 8, "same")
            .iter()
            .all(String::is_empty)
    );

    let mut s = state(Mode::Act);
    s.spec.warn_repeated_calls = 4;
    let notes = notes_of_repeats(&mut s, 4, "same");
    assert_eq!(notes[..3], ["", "", ""]);
    assert!(notes[3].contains("4 times"), "{}", notes[3]);

    let mut s = state(Mode::Act);
    s.spec.max_repeated_calls = 1;
    turn(&mut s, &[read("a", json!({}))], "x");
    let mut m = Message::assistant("");
    m.tool_calls = vec![read("b", json!({}))];
    s.push_assistant(m);
    assert!(
        matches!(step(&s), Step::Stuck(ref k) if k.times == 2),
        "{:?}",
        step(&s)
    );
}

#[test]
fn repeat_limits_from_a_row_past_the_bounds_neither_panic_nor_walk_the_whole_history() {
    let mut s = state(Mode::Act);
    s.spec.max_repeated_calls = u32::MAX;
    s.spec.warn_repeated_calls = u32::MAX;
    let notes = notes_of_repeats(&mut s, 120, "same");
    assert!(notes.iter().all(String::is_empty));
    let mut m = Message::assistant("");
    m.tool_calls = vec![read("last", json!({"path": "notes.txt"}))];
    s.push_assistant(m);
    assert!(matches!(step(&s), Step::RunTools(_)), "{:?}", step(&s));

    // Without a limit, the note counts up to the look-back and then says "more than".
    let mut s = state(Mode::Act);
    s.spec.max_repeated_calls = 0;
    let notes = notes_of_repeats(&mut s, 102, "same");
    assert!(notes[99].contains(" 100 times"), "{}", notes[99]);
    assert!(notes[101].contains("more than 100 times"), "{}", notes[101]);
}

/// A tool's output is the model's to read, and may be anyone's to write (a fetched page):
/// text shaped like the note in it is cut like the note, so two outputs that differ only
/// after it count as the same. That is no more than the output's author could do by
/// sending the same text twice; it cannot hide a real repeat either.
#[test]
fn a_forged_note_in_an_output_does_no_more_than_its_own_text_could() {
    let mut s = state(Mode::Act);
    let forged = |n: u32| format!("page\n\n[agentq: you have called `x` {n}]");
    let a = || read("a", json!({"path": "p"}));
    turn(&mut s, &[a()], &forged(1));
    let note = turn(&mut s, &[a()], &forged(2)).remove(0);
    assert!(note.contains("2 times in a row"), "{note}");
}

#[test]
fn a_paused_turn_is_no_answer_the_model_is_called_again_within_the_limits() {
    let paused = || {
        let mut m = Message::assistant("Searching.");
        m.finish_reason = Some(FinishReason::Paused);
        m
    };
    let mut s = state(Mode::Act);
    s.spec.max_background_drain_rounds = 0;
    s.push_assistant(paused());
    assert_eq!(step(&s), Step::CallLlm);
    assert_eq!(s.decide(Utc::now(), true), Step::Cancel);
    // The same text finished normally is the answer.
    let mut done = state(Mode::Act);
    done.spec.max_background_drain_rounds = 0;
    done.push_assistant(Message::assistant("Searching."));
    assert_eq!(step(&done), Step::Done(stop("Searching.")));
    // A paused turn counts as an iteration like any answer.
    s.spec.max_iterations = 1;
    assert!(matches!(step(&s), Step::Done(o) if o.reason == ExitReason::MaxIterations));
}

#[test]
fn the_web_search_is_offered_whenever_tools_are() {
    let search = WebSearch {
        max_uses: Some(2),
        ..WebSearch::default()
    };
    let act = state(Mode::Act);
    assert_eq!(
        act.request("m", &[], Some(&search)).web_search,
        Some(search.clone())
    );
    assert_eq!(act.request("m", &[], None).web_search, None);
    for mode in [Mode::Think, Mode::Plan, Mode::PlanAct] {
        let s = state(mode);
        assert_eq!(
            s.request("m", &[], Some(&search)).web_search,
            None,
            "{mode}"
        );
    }
}

/// A checkpoint written before server content, searches and the web search options
/// existed reads back as it was, with none of them; and what has none of them is written
/// as it always was.
#[test]
fn a_checkpoint_from_before_web_search_reads_and_writes_as_it_did() {
    let old = json!({
        "session_id": "s",
        "spec": {"prompt": "do the task", "tools": ["read_file"], "max_iterations": 40},
        "messages": [
            {"role": "user", "content": "do the task"},
            {"role": "assistant", "content": "reading",
             "tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a"}}],
             "usage": {"input_tokens": 10, "output_tokens": 2, "cache_read_tokens": 0,
                       "cache_write_tokens": 0, "reasoning_tokens": 0},
             "model": "m", "finish_reason": "tool_calls"},
            {"role": "tool", "content": "x", "tool_call_id": "c1", "name": "read_file"}
        ],
        "iteration": 1,
        "usage": {"input_tokens": 10, "output_tokens": 2, "cache_read_tokens": 0,
                  "cache_write_tokens": 0, "reasoning_tokens": 0},
        "drain_rounds": 0
    });
    let s: SessionState = serde_json::from_value(old.clone()).unwrap();
    assert_eq!(s.usage.web_search_requests, 0);
    assert_eq!(s.spec.web_search, None);
    assert!(s.messages.iter().all(|m| m.server_content.is_empty()));
    assert_eq!(s.messages[1].usage.unwrap().web_search_requests, 0);
    let written = serde_json::to_value(&s.messages[1]).unwrap();
    assert_eq!(written, old["messages"][1]);
    assert_eq!(serde_json::to_value(s.usage).unwrap(), old["usage"]);
    let spec = serde_json::to_value(&s.spec).unwrap();
    assert!(spec.get("web_search").is_none(), "{spec}");
}

/// A tool's output is kept for the session's life by every session in flight: the
/// history keeps it without the room its growth left spare.
#[test]
fn a_tool_result_is_kept_without_spare_room() {
    let mut s = state(Mode::Act);
    s.push_assistant(with_calls(&["c"]));
    let mut output = String::with_capacity(4096);
    output.push_str("a.txt\nb.txt\n");
    s.push_tool_result(call("c"), output, false);
    let kept = &s.messages.last().unwrap().content;
    assert_eq!(kept, "a.txt\nb.txt\n");
    assert_eq!(kept.capacity(), kept.len());
}
