"""Schedules through the client against the real server (sync and async): created with a
template, listed, paused, triggered (a fire starts a session at once, recorded in the
history), resumed and deleted; bad input answers 422 naming the field."""

import pytest

from agentq_client import APIError, AsyncClient, Client


def test_a_schedule_is_managed_and_triggered(client: Client):
    s = client.create_schedule({"prompt": "scheduled hello"}, cron="0 9 * * 1-5",
                               timezone="Europe/Paris", overlap="buffer_one")
    try:
        assert (s.timezone, s.overlap, s.paused) == ("Europe/Paris", "buffer_one", False)
        assert s.session == {"prompt": "scheduled hello"}
        assert s.id in [x.id for x in client.list_schedules(limit=500).schedules]
        assert client.pause_schedule(s.id).paused
        fire = client.trigger_schedule(s.id)
        assert (fire.outcome, fire.manual) == ("started", True)
        assert client.get_session(fire.session_id).id == fire.session_id
        page = client.list_schedule_fires(s.id)
        assert [f.session_id for f in page.fires] == [fire.session_id]
        assert not client.resume_schedule(s.id).paused
        assert client.get_schedule(s.id).last_session_id == fire.session_id
    finally:
        client.delete_schedule(s.id)
    with pytest.raises(APIError) as e:
        client.get_schedule(s.id)
    assert e.value.status == 404


def test_bad_input_names_the_field(client: Client):
    for kwargs, field in [
        (dict(cron="not cron"), "cron"),
        (dict(cron="0 9 * * *", timezone="Nowhere/Land"), "timezone"),
        (dict(every_secs=0), "every_secs"),
        (dict(every_secs=60, overlap="sometimes"), "overlap"),
    ]:
        with pytest.raises(APIError) as e:
            client.create_schedule({"prompt": "x"}, **kwargs)
        assert (e.value.status, e.value.field) == (422, field)
    with pytest.raises(APIError) as e:
        client.create_schedule({"prompt": 5}, every_secs=60)
    assert (e.value.status, e.value.field) == (422, "session.prompt")


@pytest.mark.anyio
async def test_the_async_client_manages_schedules(url):
    async with AsyncClient() as aq:
        s = await aq.create_schedule({"prompt": "async tick"}, every_secs=3600)
        try:
            assert s.every_secs == 3600 and s.cron is None
            assert (await aq.trigger_schedule(s.id)).outcome == "started"
            assert len((await aq.list_schedule_fires(s.id)).fires) == 1
            assert (await aq.pause_schedule(s.id)).paused
            assert not (await aq.resume_schedule(s.id)).paused
            assert (await aq.get_schedule(s.id)).id == s.id
            assert s.id in [x.id for x in (await aq.list_schedules(limit=500)).schedules]
        finally:
            await aq.delete_schedule(s.id)
