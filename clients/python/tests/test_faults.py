"""The faults a client must survive, through the fault proxy: event streams cut in the
middle of an event (resumed from Last-Event-ID, nothing lost or repeated), 429 and 503
with Retry-After (waited for, never early), and retries that stop."""

import threading
import time

import pytest

from agentq_client import APIError, AsyncClient, Client
from conftest import SLOW, proxy_stats


def as_tuples(events):
    # Not the ids: a stream opened before the worker's events reach Redis starts from
    # ids rebuilt from the transcript (`t-<seq>-<k>`), a later replay has Redis's.
    assert all(e.id for e in events) and len({e.id for e in events}) == len(events)
    return [(e.event, e.data) for e in events]


def test_a_cut_stream_resumes_without_loss_or_repeat(client: Client, fault_url):
    # Slow enough for the reader to be there before the first event and as the last
    # ones are written: the server's rebuilt events (a stream opened after the run ended
    # and before its events were stored) are not this test's subject.
    ref = client.create_session(f"{SLOW} stream me", files={"input.txt": "cut"})
    # Live: followed from its start while it runs, through a proxy that cuts every
    # connection after two events.
    with Client(f"{fault_url}/drop") as cut:
        live = list(cut.events(ref.id, timeout=120))
    whole = list(client.events(ref.id, timeout=120))
    assert as_tuples(live) == as_tuples(whole)
    assert whole[-1].event == "session_completed"
    assert len({e.id for e in whole}) == len(whole)
    stats = proxy_stats(fault_url)
    assert stats["cuts"] >= 3, stats
    # Replayed after the end, from the middle on: the rest, once.
    with Client(f"{fault_url}/drop") as cut:
        rest = list(cut.events(ref.id, last_event_id=whole[2].id))
    assert as_tuples(rest) == as_tuples(whole[3:])


@pytest.mark.anyio
async def test_the_async_stream_resumes_too(client: Client, fault_url):
    ref = client.create_session(f"{SLOW} stream me async")
    async with AsyncClient(f"{fault_url}/drop") as cut:
        live = [e async for e in cut.events(ref.id, timeout=120)]
    whole = list(client.events(ref.id))
    assert as_tuples(live) == as_tuples(whole)
    assert proxy_stats(fault_url)["cuts"] >= 3


def test_429_and_503_are_retried_after_retry_after(fault_url):
    with Client(f"{fault_url}/throttle") as slow:
        started = time.monotonic()
        ref = slow.create_session("throttled")
        slow.get_session(ref.id)
        slow.list_sessions(limit=1)
        elapsed = time.monotonic() - started
    stats = proxy_stats(fault_url)
    # Three calls, each refused once (429, 503, 429), each retried after the second it
    # was told to wait, never before.
    assert stats["throttled"] == 3 and stats["early"] == 0, stats
    assert elapsed >= 3.0


@pytest.mark.anyio
async def test_the_async_client_honours_retry_after(fault_url):
    async with AsyncClient(f"{fault_url}/throttle") as slow:
        ref = await slow.create_session("throttled async")
        await slow.get_session(ref.id)
    stats = proxy_stats(fault_url)
    assert stats["throttled"] == 2 and stats["early"] == 0, stats


def test_retries_are_bounded(fault_url):
    with Client(f"{fault_url}/always429", max_retries=2) as refused:
        with pytest.raises(APIError) as e:
            refused.list_sessions()
    assert e.value.status == 429 and e.value.code == "rate_limited"
    assert e.value.retry_after == 0.0
    assert proxy_stats(fault_url)["refused"] == 3
