"""The suite runs against a real server: `AGENTQ_URL` and `AGENTQ_API_KEY` name it (the
Rust test cli/tests/it/clients.rs starts `agentq dev`, then a scheduler and a worker, on
the scripted model), `AGENTQ_FAULT_URL` the fault proxy in front of it
(clients/testing/fault_proxy.py). Without them the server tests are skipped."""

import os
import time

import httpx
import pytest

from agentq_client import Client

# What the server's script does (cli/tests/it/clients.rs writes it): a plain prompt reads
# `input.txt`, writes `out/result.txt` and answers `Done: <prompt>`; these markers in a
# prompt pick the other scripts.
HOLD = "HOLD-FOR-APPROVAL"
FAIL_ONCE = "FAIL-ONCE"
SLOW = "STREAM-SLOWLY"

needs_server = pytest.mark.skipif(not os.environ.get("AGENTQ_URL"),
                                  reason="AGENTQ_URL names no server")


@pytest.fixture(scope="session")
def url() -> str:
    if not os.environ.get("AGENTQ_URL"):
        pytest.skip("AGENTQ_URL names no server")
    return os.environ["AGENTQ_URL"]


@pytest.fixture(scope="session")
def spec(url):
    return httpx.get(f"{url}/openapi.json").json()


@pytest.fixture
def client(url):
    with Client() as c:
        yield c


@pytest.fixture
def fault_url():
    u = os.environ.get("AGENTQ_FAULT_URL")
    if not u:
        pytest.skip("AGENTQ_FAULT_URL names no fault proxy")
    httpx.post(f"{u}/__reset")
    return u


def proxy_stats(fault_url):
    return httpx.get(f"{fault_url}/__stats").json()


def has_path(spec, path, method="get"):
    return method in spec.get("paths", {}).get(path, {})


def has_param(spec, path, name, method="get"):
    op = spec.get("paths", {}).get(path, {}).get(method, {})
    return any(p.get("name") == name for p in op.get("parameters", []))


@pytest.fixture
def anyio_backend():
    return "asyncio"


def poll(read, ready, timeout=60.0, pause=0.05):
    """`read()` until `ready` holds for what it returns (a state that announces nothing),
    for `timeout` seconds at most."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if ready(value):
            return value
        assert time.monotonic() < deadline, f"timed out; last seen: {value!r}"
        time.sleep(pause)
