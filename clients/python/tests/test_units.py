"""The parts that need no server: the event decoder, the retry rule, request encoding,
and the async client being the generated twin of the sync one."""

import importlib.util
from pathlib import Path

from agentq_client import _core as c
from agentq_client.models import Event

ROOT = Path(__file__).resolve().parents[1]


def decode(text):
    d = c.SSEDecoder()
    return [ev for line in text.split("\n") if (ev := d.feed(line)) is not None]


def test_events_are_decoded_and_a_cut_event_is_dropped():
    text = (": keep-alive\n\n"
            "id: 1-0\nevent: text_delta\ndata: {\"type\":\"text_delta\",\"text\":\"a\",\"seq\":2}\n\n"
            "event: reset\ndata: {\"seq\":2}\n\n"
            "id: 1-1\nevent: message\ndata: line one\ndata: line two\n\n"
            "id: 1-2\nevent: text_delta\ndata: {\"text\":")
    evs = decode(text)
    assert [(e.id, e.event) for e in evs] == [("1-0", "text_delta"), (None, "reset"),
                                             ("1-1", "message")]
    assert evs[0].data["text"] == "a" and evs[0].seq == 2
    assert evs[1].seq == 2
    assert evs[2].data == "line one\nline two"


def test_stream_state_resumes_from_the_last_id_and_gives_up_without_progress():
    st = c.StreamState(max_reconnects=2)
    assert "last-event-id" not in st.headers()
    st.seen(Event(id="5-0", event="text_delta", data={}))
    assert st.headers()["last-event-id"] == "5-0"
    assert st.dropped(None) == 0.0
    st.dropped(None)
    try:
        st.dropped(None)
    except c.StreamError:
        pass
    else:
        raise AssertionError("a third drop in a row without an event must give up")


def test_retry_after_is_honoured_and_bounded():
    assert c.retry_delay(429, {"retry-after": "3"}, 1, 5) == 3.0
    assert c.retry_delay(503, {"retry-after": "0"}, 5, 5) == 0.0
    assert c.retry_delay(503, {"retry-after": "1"}, 6, 5) is None
    assert c.retry_delay(429, {"retry-after": "3600"}, 1, 5) is None
    assert c.retry_delay(400, {"retry-after": "1"}, 1, 5) is None
    assert 0 < c.retry_delay(429, {}, 1, 5) <= 0.25
    assert c.retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0.0


def test_files_are_text_or_base64():
    enc = c.encode_files({"a.txt": "hi", "b.bin": b"\x00\xff", "c.txt": b"text", "d": b"a\0b"})
    assert enc == {"a.txt": "hi", "b.bin": {"base64": "AP8="}, "c.txt": "text",
                   "d": {"base64": "YQBi"}}


def test_errors_carry_the_body():
    e = c.APIError.from_response(
        422, {}, b'{"error":{"code":"unknown_field","message":"no such field","field":"x"}}')
    assert (e.status, e.code, e.field, e.message) == (422, "unknown_field", "x", "no such field")
    e = c.APIError.from_response(502, {"retry-after": "2"}, b"<html>bad gateway</html>")
    assert (e.code, e.field, e.retry_after) == ("http_502", None, 2.0)


def test_query_repeats_lists_and_mappings():
    q = c.query(status="failed", metadata={"team": "a", "run": "7"}, limit=None, tool=["x", "y"])
    assert q == [("status", "failed"), ("metadata", "team=a"), ("metadata", "run=7"),
                 ("tool", "x"), ("tool", "y")]


def test_the_async_client_is_generated_from_the_sync_one():
    spec = importlib.util.spec_from_file_location("gen_async", ROOT / "scripts" / "gen_async.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    src = (ROOT / "src" / "agentq_client" / "_sync.py").read_text()
    committed = (ROOT / "src" / "agentq_client" / "_async.py").read_text()
    assert gen.generate(src) == committed, "run: python clients/python/scripts/gen_async.py"
