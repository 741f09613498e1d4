"""Verifying a delivery, as the Standard Webhooks specification (v1) says.

    from agentq_client import webhooks
    payload = webhooks.verify(secret, request.headers, request.body)  # raw body bytes

`secret` is the endpoint's `whsec_…` (from `create_webhook` or `rotate_webhook_secret`).
The signed content is `{webhook-id}.{webhook-timestamp}.{body}`; `webhook-signature` holds
one `v1,<base64 HMAC-SHA256>` per secret in force, separated by spaces (two during a
rotation's overlap), and any one matching is enough. A timestamp further than `tolerance`
seconds from now is refused, so that a captured delivery cannot be replayed later.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from typing import Mapping, Optional, Union

from ._core import AgentqError
from .models import WebhookPayload

SECRET_PREFIX = "whsec_"
# The specification's suggestion: five minutes either way.
DEFAULT_TOLERANCE = 300


class WebhookVerificationError(AgentqError):
    """The delivery is not proven to come from the server: refuse it (answer 4xx)."""


def _key(secret: Union[str, bytes]) -> bytes:
    if isinstance(secret, bytes):
        key = secret
    else:
        text = secret[len(SECRET_PREFIX):] if secret.startswith(SECRET_PREFIX) else secret
        try:
            key = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as e:
            raise WebhookVerificationError(f"the secret is not base64 after `whsec_`: {e}")
    if not key:
        raise WebhookVerificationError("the secret is empty")
    return key


def sign(secret: Union[str, bytes], msg_id: str, timestamp: int, body: bytes) -> str:
    """The `v1,…` signature of one delivery under `secret`."""
    content = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def verify(secret: Union[str, bytes], headers: Mapping[str, str],
           body: Union[bytes, str], *, tolerance: float = DEFAULT_TOLERANCE,
           now: Optional[float] = None) -> WebhookPayload:
    """The delivery's payload once `headers` prove `body` was signed with `secret`
    within `tolerance` seconds of `now` (the clock's time when absent); else
    `WebhookVerificationError` saying why. Pass the body's bytes exactly as received:
    parsed and encoded again, it would not match."""
    lowered = {k.lower(): v for k, v in headers.items()}
    missing = [h for h in ("webhook-id", "webhook-timestamp", "webhook-signature")
               if not lowered.get(h)]
    if missing:
        raise WebhookVerificationError(f"missing header {', '.join(missing)}")
    msg_id = lowered["webhook-id"]
    try:
        timestamp = int(lowered["webhook-timestamp"])
    except ValueError:
        raise WebhookVerificationError("webhook-timestamp is not a whole number of seconds")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance:
        raise WebhookVerificationError(
            f"webhook-timestamp is {int(current - timestamp)} s from now, over the "
            f"tolerance of {tolerance} s")
    raw = body.encode() if isinstance(body, str) else bytes(body)
    expected = sign(secret, msg_id, timestamp, raw).encode()
    # Every candidate is compared in constant time; a version other than v1 never matches.
    if not any(hmac.compare_digest(expected, sig.encode())
               for sig in lowered["webhook-signature"].split(" ") if sig):
        raise WebhookVerificationError("no signature in webhook-signature matches the secret")
    try:
        return WebhookPayload.model_validate(json.loads(raw))
    except ValueError as e:
        raise WebhookVerificationError(f"the signed body is not a webhook payload: {e}")
