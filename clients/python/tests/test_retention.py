"""Retention rules through the admin API: stored, listed over the configured ones, a bad
one refused naming its field, deleted."""

import time

import pytest

from agentq_client import APIError, AsyncClient, Client

from conftest import has_path


def _retention(spec) -> bool:
    return has_path(spec, "/v1/admin/retention")


def test_retention_rules_are_set_listed_and_deleted(client: Client, spec):
    if not _retention(spec):
        pytest.skip("the server has no retention rules")
    tenant = f"keeper{time.time_ns()}"
    rule = client.set_tenant_retention(tenant, 30, keep="result")
    assert (rule.kind, rule.name, rule.days, rule.keep, rule.source) == (
        "tenant", tenant, 30, "result", "stored")
    assert rule.updated_at is not None
    queue = client.set_queue_retention("default", 90)
    assert (queue.days, queue.keep) == (90, "none")
    listed = client.retention_rules()
    assert any(r.name == tenant and r.days == 30 for r in listed.tenants), listed
    assert any(r.name == "default" and r.source == "stored" for r in listed.queues), listed
    for days in (0, -1, 36501):
        with pytest.raises(APIError) as e:
            client.set_tenant_retention(tenant, days)
        assert e.value.status == 422 and e.value.field == "days"
    with pytest.raises(APIError) as e:
        client.set_queue_retention("default", 7, keep="transcript")
    assert e.value.field == "keep"
    client.delete_tenant_retention(tenant)
    client.delete_queue_retention("default")
    listed = client.retention_rules()
    assert not any(r.name == tenant for r in listed.tenants), listed
    with pytest.raises(APIError) as e:
        client.delete_tenant_retention(tenant)
    assert e.value.status == 404


@pytest.mark.anyio
async def test_the_async_client_sets_retention_too(spec):
    if not _retention(spec):
        pytest.skip("the server has no retention rules")
    tenant = f"asynckeeper{time.time_ns()}"
    async with AsyncClient() as aq:
        rule = await aq.set_tenant_retention(tenant, 7)
        assert (rule.days, rule.keep) == (7, "none")
        assert any(r.name == tenant for r in (await aq.retention_rules()).tenants)
        await aq.delete_tenant_retention(tenant)
