"""Sessions against the real server, through the sync and the async client."""

import io
import time
import tarfile

import pytest

from agentq_client import APIError, AsyncClient, Client
from conftest import FAIL_ONCE, HOLD, has_param, has_path, poll

BINARY = b"\x00\x01\xfe\xff"


def test_create_with_files_wait_and_read_everything(client: Client):
    ref = client.create_session("summarise", files={"input.txt": "hello there",
                                                    "data/blob.bin": BINARY},
                                metadata={"team": "clients"}, max_iterations=8,
                                tools=["read_file", "write_file"])
    assert ref.status == "queued"
    done = client.wait(ref.id, timeout=120)
    assert done.status == "completed", done
    assert done.result == "Done: summarise"
    assert done.finish_reason == "stop"
    assert done.usage.output_tokens >= 0

    paths = {f.path: f for f in client.list_files(ref.id)}
    assert {"input.txt", "data/blob.bin", "out/result.txt"} <= set(paths)
    assert paths["data/blob.bin"].size == len(BINARY)
    assert client.download_file(ref.id, "data/blob.bin") == BINARY
    assert client.download_file(ref.id, "out/result.txt") == b"written by the script"
    with tarfile.open(fileobj=io.BytesIO(client.download_tar(ref.id))) as tar:
        names = tar.getnames()
        assert "out/result.txt" in names
        assert tar.extractfile("input.txt").read() == b"hello there"

    msgs = client.messages(ref.id)
    assert msgs[0].role == "user"
    assert any(tc.name == "write_file" for msg in msgs for tc in (msg.tool_calls or []))

    detail = client.get_session(ref.id)
    assert detail.metadata == {"team": "clients"} and detail.children == []
    ids = [s.id for s in client.iter_sessions(status="completed", limit=1)]
    assert ref.id in ids and len(ids) == len(set(ids))
    assert client.list_sessions(status="failed").sessions == [] or all(
        s.status == "failed" for s in client.list_sessions(status="failed").sessions)


def test_a_bad_request_raises_with_its_field(client: Client):
    with pytest.raises(APIError) as e:
        client.create_session("typo", max_iteration=3)
    assert e.value.status == 422
    assert e.value.code == "unknown_field"
    assert e.value.field == "max_iteration"
    assert e.value.body["error"]["field"] == "max_iteration"
    with pytest.raises(APIError) as e:
        client.create_session("bad mode", mode="sideways")
    assert e.value.status in (400, 422) and e.value.field == "mode"
    with pytest.raises(APIError) as e:
        client.get_session("00000000-0000-0000-0000-000000000000")
    assert e.value.status == 404 and e.value.code == "not_found"


def held(client: Client, prompt: str) -> tuple[str, str]:
    """A session holding a write for approval, once it waits for the decision: its id and
    the held call's id. Polled, not followed through the events: a stream opened while
    the worker's events are not yet in Redis is rebuilt from the transcript, which holds
    no `approval_requested` (a server matter, not the client's)."""
    ref = client.create_session(prompt, tools=["write_file"], sensitive_tools=["write_file"])
    s = poll(lambda: client.get_session(ref.id), lambda s: s.status == "awaiting_approval",
             timeout=120)
    assert [p.tool for p in s.pending_approvals] == ["write_file"], s
    return ref.id, s.pending_approvals[0].tool_call_id


def test_approve_deny_and_cancel_held_calls(client: Client, spec):
    id1, call1 = held(client, f"{HOLD} one")
    if has_path(spec, "/v1/approvals"):
        page = client.list_approvals(session_id=id1)
        assert [(a.session_id, a.tool_call_id) for a in page.approvals] == [(id1, call1)]
    decided = client.approve(id1, call1)
    assert decided.approve and decided.tool_call_id == call1
    assert client.wait(id1, timeout=120).status == "completed"
    assert client.download_file(id1, "approved.txt") == b"approved"

    id2, call2 = held(client, f"{HOLD} two")
    client.deny(id2, call2, reason="not today")
    s2 = client.wait(id2, timeout=120)
    assert s2.status == "completed"
    assert "approved.txt" not in {f.path for f in client.list_files(id2)}

    id3, _ = held(client, f"{HOLD} three")
    assert client.cancel_session(id3).status == "cancelled"
    assert client.wait(id3, timeout=60).status == "cancelled"
    with pytest.raises(APIError) as e:
        client.cancel_session(id3)
    assert e.value.status == 409 and e.value.code == "already_finished"


def test_approve_with_edited_arguments(client: Client, spec):
    body = spec["components"]["schemas"]["ApprovalRequest"]
    if "arguments" not in body.get("properties", {}):
        pytest.skip("this server takes no edited arguments yet")
    sid, call = held(client, f"{HOLD} edited")
    client.approve(sid, call, arguments={"path": "approved.txt", "content": "edited"})
    assert client.wait(sid, timeout=120).status == "completed"
    assert client.download_file(sid, "approved.txt") == b"edited"


def test_a_failed_session_is_retried(client: Client, spec):
    ref = client.create_session(f"{FAIL_ONCE} single")
    failed = client.wait(ref.id, timeout=120)
    assert failed.status == "failed" and failed.finish_reason == "error", failed
    assert client.retry_session(ref.id).status == "queued"
    assert client.wait(ref.id, timeout=120).status == "completed"

    ref2 = client.create_session(f"{FAIL_ONCE} bulk")
    assert client.wait(ref2.id, timeout=120).status == "failed"
    extra = {"status": "failed"} if _filter_has(spec, "status") else {}
    redriven = client.retry_sessions(error_contains="scripted refusal", **extra)
    assert ref2.id in [s.id for s in redriven.sessions]
    assert client.wait(ref2.id, timeout=120).status == "completed"


def _filter_has(spec, name):
    return name in spec["components"]["schemas"]["SessionFilter"].get("properties", {})


def test_new_list_filters(client: Client, spec):
    if not has_param(spec, "/v1/sessions", "finish_reason"):
        pytest.skip("this server has no finish_reason filter yet")
    ref = client.create_session("filtered", metadata={"suite": "filters"}, queue="default")
    client.wait(ref.id, timeout=120)
    page = client.list_sessions(finish_reason="stop", queue="default",
                                metadata={"suite": "filters"})
    assert [s.id for s in page.sessions] == [ref.id]
    assert client.list_sessions(finish_reason="error", metadata={"suite": "filters"}).sessions == []


@pytest.mark.anyio
async def test_the_async_client_does_the_same():
    async with AsyncClient() as aq:
        ref = await aq.create_session("async", files={"input.txt": "from async"},
                                      tools=["read_file", "write_file"])
        kinds = [ev.event async for ev in aq.events(ref.id, timeout=120)]
        assert kinds[-1] == "session_completed" and "tool_call" in kinds
        done = await aq.wait(ref.id, timeout=120)
        assert done.result == "Done: async"
        assert await aq.download_file(ref.id, "out/result.txt") == b"written by the script"
        batch = await aq.upload_batch([{"prompt": "async upload"}], metadata={"via": "async"})
        assert batch.total == 1 and batch.metadata == {"via": "async"}
        seen = [s.id async for s in aq.iter_sessions(limit=2)]
        assert ref.id in seen
        with pytest.raises(APIError) as e:
            await aq.create_session("typo", max_iteration=3)
        assert e.value.field == "max_iteration"


def test_counts_costs_and_operations(client: Client, spec):
    if not has_path(spec, "/v1/sessions/counts"):
        pytest.skip("the server has no counts")
    word = f"countme{time.time_ns()}"
    ref = client.create_session(f"count {word} please")
    client.wait(ref.id, timeout=120)
    counts = client.count_sessions(q=word)
    listed = client.list_sessions(q=word).sessions
    assert [s.id for s in listed] == [ref.id]
    assert counts.total == len(listed) == 1 and counts.complete
    assert counts.by_status == {"completed": 1}
    # A `%` is literal: it matches no prompt here.
    assert client.count_sessions(q=f"{word}%").total == 0
    with pytest.raises(APIError) as e:
        client.count_sessions(q="x" * 201)
    assert e.value.field == "q"

    report = client.costs()
    assert report.since < report.until
    assert any(r.sessions >= 1 for r in report.rows), report
    with pytest.raises(APIError) as e:
        client.costs(since="2020-01-01T00:00:00Z", until="2022-01-01T00:00:00Z")
    assert e.value.field == "since"

    ops = client.operations()
    assert set(ops.waiting) == {"children", "approval", "rate_limit", "budget"}
    default = next(q for q in ops.queues if q.name == "default")
    assert default.error is None and default.length is not None and default.held >= 0


@pytest.mark.anyio
async def test_the_async_client_counts_costs_and_operations(spec):
    if not has_path(spec, "/v1/sessions/counts"):
        pytest.skip("the server has no counts")
    async with AsyncClient() as aq:
        word = f"asynccount{time.time_ns()}"
        ref = await aq.create_session(f"count {word}")
        await aq.wait(ref.id, timeout=120)
        counts = await aq.count_sessions(q=word)
        assert counts.total == 1 and counts.by_status == {"completed": 1}
        assert (await aq.costs()).rows
        assert any(q.name == "default" for q in (await aq.operations()).queues)


def _forks(spec) -> bool:
    return has_path(spec, "/v1/sessions/{id}/fork", "post")


def test_a_session_is_forked_from_a_step(client: Client, spec):
    if not _forks(spec):
        pytest.skip("this server has no forks yet")
    ref = client.create_session("fork me", files={"input.txt": "to fork"},
                                tools=["read_file", "write_file"])
    assert client.wait(ref.id, timeout=120).status == "completed"
    origin = client.messages(ref.id)
    fork = client.fork(ref.id, 1, message="once more")
    assert fork.forked_from == ref.id and fork.at_iteration == 1 and fork.status == "queued"
    detail = client.get_session(fork.id)
    # A worker may have run the fork on by now: it starts at iteration 1 and only counts
    # up from there, on the first 3 messages of its origin.
    assert detail.forked_from == ref.id and detail.fork_at == 3 and detail.iterations >= 1
    msgs = client.messages(fork.id)
    assert msgs[:3] == origin[:3] and msgs[3].content == "once more"
    assert "input.txt" in {f.path for f in client.list_files(fork.id)}
    assert client.wait(fork.id, timeout=120).finished
    assert client.messages(ref.id) == origin
    with pytest.raises(APIError) as e:
        client.fork(ref.id, 99)
    assert e.value.status == 422 and e.value.field == "at_iteration"


@pytest.mark.anyio
async def test_the_async_client_forks_too(spec):
    if not _forks(spec):
        pytest.skip("this server has no forks yet")
    async with AsyncClient() as aq:
        ref = await aq.create_session("async fork", files={"input.txt": "x"},
                                      tools=["read_file", "write_file"])
        await aq.wait(ref.id, timeout=120)
        fork = await aq.fork(ref.id, 0)
        assert (await aq.get_session(fork.id)).forked_from == ref.id
        assert fork.at_iteration == 0
        # It runs at once: its history starts with the prompt alone, then its own steps.
        assert (await aq.messages(fork.id))[0].content == "async fork"
        with pytest.raises(APIError) as e:
            await aq.fork(ref.id, -1)
        assert e.value.field == "at_iteration"
