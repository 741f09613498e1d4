"""Webhooks through the client against the real server: an endpoint registered, managed
and deleted with the client's methods (sync and async), a real delivery received by a
local HTTP server and verified with `agentq_client.webhooks.verify`, cross-checked with the
`standardwebhooks` package, and the attacks a receiver must refuse. The server allows the
receiver's host (cli/tests/it/clients.rs sets `AGENTQ_WEBHOOKS_ALLOWED_HOSTS=127.0.0.1`)."""

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import standardwebhooks

from agentq_client import AsyncClient, Client, WebhookVerificationError, webhooks
from conftest import HOLD

SECRET = "whsec_" + base64.b64encode(b"a receiver's own test secret, 32B").decode()


class Receiver:
    """A local HTTP server that answers 204 to every POST and keeps what it got; a reader
    waits for a delivery on a condition, not a sleep."""

    def __init__(self):
        self.got = []
        self.changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.changed:
                    receiver.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    receiver.changed.notify_all()
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait_for(self, match, timeout=120.0):
        """The first delivery whose parsed body `match` holds for."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for headers, body in self.got:
                    if match(json.loads(body)):
                        return headers, body
                left = deadline - time.monotonic()
                assert left > 0, f"no matching delivery; got {[b for _, b in self.got]}"
                self.changed.wait(left)

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def test_a_delivery_is_verified_and_attacks_are_refused(client: Client, receiver):
    hook = client.create_webhook(receiver.url, ["session.completed", "session.waiting"],
                                 description="clients' test")
    try:
        assert hook.secret and hook.secret.startswith("whsec_")
        assert hook.status == "enabled" and hook.events == ["session.completed",
                                                            "session.waiting"]
        assert client.get_webhook(hook.id).secret is None
        assert hook.id in [w.id for w in client.list_webhooks()]

        ref = client.create_session("webhook me")
        assert client.wait(ref.id, timeout=120).status == "completed"
        headers, body = receiver.wait_for(
            lambda b: b["type"] == "session.completed" and b["data"]["session_id"] == ref.id)

        payload = webhooks.verify(hook.secret, headers, body)
        assert payload.type == "session.completed"
        assert payload.data["status"] == "completed" and payload.data["finish_reason"] == "stop"
        # The reference implementation agrees.
        assert standardwebhooks.Webhook(hook.secret).verify(body, headers)["data"] == \
            payload.data

        # What a receiver must refuse, each refused by both.
        tampered = body.replace(b'"completed"', b'"cancelled"', 1)
        assert tampered != body
        # Signed right, but an hour ago: a replay.
        then = int(time.time()) - 3600
        old = dict(headers, **{"webhook-timestamp": str(then), "webhook-signature":
                               webhooks.sign(hook.secret, headers["webhook-id"], then, body)})
        for name, (secret, hdrs, b) in {
            "a tampered body": (hook.secret, headers, tampered),
            "the wrong secret": (SECRET, headers, body),
            "an old timestamp": (hook.secret, old, body),
            "no signature": (hook.secret, {k: v for k, v in headers.items()
                                           if k.lower() != "webhook-signature"}, body),
            "no id": (hook.secret, {k: v for k, v in headers.items()
                                    if k.lower() != "webhook-id"}, body),
        }.items():
            with pytest.raises(WebhookVerificationError):
                webhooks.verify(secret, hdrs, b)
                pytest.fail(f"{name} verified")
            with pytest.raises(standardwebhooks.webhooks.WebhookVerificationError):
                standardwebhooks.Webhook(secret).verify(b, hdrs)
        # A tolerance is the receiver's to choose.
        webhooks.verify(hook.secret, old, body, tolerance=7200)

        # A held call announces itself with the call.
        held = client.create_session(f"{HOLD} webhook", tools=["write_file"],
                                     sensitive_tools=["write_file"])
        headers, body = receiver.wait_for(
            lambda b: b["type"] == "session.waiting" and b["data"]["session_id"] == held.id)
        waiting = webhooks.verify(hook.secret, headers, body)
        assert [c["tool"] for c in waiting.data["calls"]] == ["write_file"]
        detail = client.get_session(held.id)
        assert waiting.data["calls"][0]["tool_call_id"] == \
            detail.pending_approvals[0].tool_call_id
        client.cancel_session(held.id)

        deliveries = list(client.iter_deliveries(hook.id, limit=1))
        assert {d.session_id for d in deliveries} >= {ref.id, held.id}
        assert all(d.state in ("pending", "delivered", "dead") for d in deliveries)
        assert client.redrive_webhook(hook.id).requeued == 0
        assert client.list_deliveries(hook.id, state="dead").deliveries == []

        rotated = client.rotate_webhook_secret(hook.id, overlap_secs=60)
        assert rotated.secret and rotated.secret != hook.secret
        assert rotated.previous_secret_expires_at is not None
        assert client.enable_webhook(hook.id).status == "enabled"
    finally:
        client.delete_webhook(hook.id)
    assert hook.id not in [w.id for w in client.list_webhooks()]


def test_rotation_overlap_signatures_verify_with_either_secret():
    body = b'{"type":"batch.completed","timestamp":"2026-12-01T00:00:00Z","data":{"batch_id":"b"}}'
    other = "whsec_" + base64.b64encode(b"another secret of thirty-two b.").decode()
    now = int(time.time())
    sigs = f"{webhooks.sign(SECRET, 'msg_1', now, body)} {webhooks.sign(other, 'msg_1', now, body)}"
    headers = {"Webhook-Id": "msg_1", "Webhook-Timestamp": str(now), "Webhook-Signature": sigs}
    for secret in (SECRET, other):
        assert webhooks.verify(secret, headers, body).data == {"batch_id": "b"}
        assert standardwebhooks.Webhook(secret).verify(body, headers)["data"] == {"batch_id": "b"}
    with pytest.raises(WebhookVerificationError):
        webhooks.verify("whsec_" + base64.b64encode(b"x" * 32).decode(), headers, body)
    with pytest.raises(WebhookVerificationError):
        webhooks.verify(SECRET, dict(headers, **{"Webhook-Timestamp": "soon"}), body)
    with pytest.raises(WebhookVerificationError):
        webhooks.verify(SECRET, dict(headers, **{"Webhook-Timestamp": str(now + 3600)}), body)


@pytest.mark.anyio
async def test_the_async_client_manages_webhooks(url, receiver):
    async with AsyncClient() as aq:
        hook = await aq.create_webhook(receiver.url, ["batch.completed"])
        try:
            assert hook.secret
            assert (await aq.get_webhook(hook.id)).url == receiver.url
            assert hook.id in [w.id for w in await aq.list_webhooks()]
            page = await aq.list_deliveries(hook.id)
            assert page.deliveries == [] and page.next_cursor is None
            assert [d async for d in aq.iter_deliveries(hook.id)] == []
            assert (await aq.redrive_webhook(hook.id)).requeued == 0
            assert (await aq.rotate_webhook_secret(hook.id)).secret != hook.secret
            assert (await aq.enable_webhook(hook.id)).status == "enabled"
        finally:
            await aq.delete_webhook(hook.id)
        assert hook.id not in [w.id for w in await aq.list_webhooks()]
        # The async methods that read a field of their answer (awaited first).
        ref = await aq.create_session("async reads", files={"input.txt": "x"},
                                      tools=["read_file", "write_file"])
        assert (await aq.wait(ref.id, timeout=120)).status == "completed"
        assert (await aq.messages(ref.id))[0].role == "user"
        assert "out/result.txt" in {f.path for f in await aq.list_files(ref.id)}


def test_the_specifications_example_signs_as_published():
    # standard-webhooks' own test vector.
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    sig = webhooks.sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330,
                        b'{"test": 2432232314}')
    assert sig == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    with pytest.raises(WebhookVerificationError):
        webhooks.verify("whsec_not base64!", {"webhook-id": "m", "webhook-timestamp": "1",
                                              "webhook-signature": sig}, b"{}", now=1)
