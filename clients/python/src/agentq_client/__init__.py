"""Python client for the agentq API (sync: `Client`, asyncio: `AsyncClient`).

    from agentq_client import Client
    with Client() as aq:  # AGENTQ_URL, AGENTQ_API_KEY
        s = aq.create_session("Summarise notes.txt", files={"notes.txt": "..."})
        print(aq.wait(s.id).result)
"""

from ._async import AsyncClient
from ._core import AgentqError, APIError, StreamError, WaitTimeout
from ._sync import Client
from . import models, webhooks
from .models import (
    Batch,
    BatchResult,
    ForkResult,
    Event,
    FileEntry,
    Fire,
    Message,
    Schedule,
    SessionDetail,
    SessionRef,
    SessionView,
    Webhook,
    WebhookPayload,
)
from .webhooks import WebhookVerificationError

__all__ = [
    "APIError",
    "AgentqError",
    "AsyncClient",
    "Batch",
    "BatchResult",
    "ForkResult",
    "Client",
    "Event",
    "FileEntry",
    "Fire",
    "Message",
    "Schedule",
    "SessionDetail",
    "SessionRef",
    "SessionView",
    "StreamError",
    "WaitTimeout",
    "Webhook",
    "WebhookPayload",
    "WebhookVerificationError",
    "models",
    "webhooks",
]
