"""What the sync and the async client share: settings from the environment, every
operation as a request description (`Call`), the answer's decoding, the retry rule, the
server-sent events decoder and the error type. The two clients only send the calls."""

from __future__ import annotations

import base64
import email.utils
import json
import os
import random
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Generic, Iterable, Iterator, Mapping, Optional, TypeVar, Union
from urllib.parse import quote

import httpx

from . import models as m

T = TypeVar("T")

DEFAULT_URL = "http://127.0.0.1:8080"
#: Attempts after the first for a 429 or 503 answer (or a connection that failed before
#: anything was sent).
DEFAULT_MAX_RETRIES = 5
#: The longest a single `Retry-After` is honoured for; a longer one is an error at once.
MAX_RETRY_AFTER = 60.0
#: Consecutive reconnects of an event stream that received nothing before giving up.
DEFAULT_MAX_RECONNECTS = 8

FileValue = Union[str, bytes]


class AgentqError(Exception):
    """Base of every error this client raises."""


class APIError(AgentqError):
    """The server answered with an error: its status and its JSON body's
    `{"error": {"code", "message", "field"}}`."""

    def __init__(self, status: int, code: str, message: str, field: Optional[str], body: Any,
                 retry_after: Optional[float] = None):
        super().__init__(f"{status} {code}: {message}" + (f" (field {field})" if field else ""))
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.body = body
        self.retry_after = retry_after

    @classmethod
    def from_response(cls, status: int, headers: Mapping[str, str], content: bytes) -> "APIError":
        body: Any
        try:
            body = json.loads(content) if content else None
        except ValueError:
            body = content.decode("utf-8", "replace")
        detail = body.get("error") if isinstance(body, dict) else None
        if isinstance(detail, dict):
            code = str(detail.get("code", "unknown"))
            message = str(detail.get("message", ""))
            fld = detail.get("field")
        else:
            code, message, fld = f"http_{status}", str(body or ""), None
        return cls(status, code, message, fld, body, retry_after_seconds(headers))


class StreamError(AgentqError):
    """An event stream kept dropping without delivering anything."""


class WaitTimeout(AgentqError, TimeoutError):
    """`wait()` reached its timeout before the session (or batch) finished."""


def env_settings(url: Optional[str], api_key: Optional[str]) -> tuple[str, Optional[str]]:
    url = url or os.environ.get("AGENTQ_URL") or os.environ.get("AGENTQ_API_URL") or DEFAULT_URL
    key = api_key if api_key is not None else os.environ.get("AGENTQ_API_KEY")
    return url.rstrip("/"), key or None


def headers_for(api_key: Optional[str]) -> dict[str, str]:
    h = {"user-agent": "agentq-client-python/0.1", "accept": "application/json"}
    if api_key:
        h["authorization"] = f"Bearer {api_key}"
    return h


def retry_after_seconds(headers: Mapping[str, str]) -> Optional[float]:
    """`Retry-After` as seconds: delta-seconds or an HTTP date; `None` if absent or bad."""
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        return max(0.0, float(int(raw)))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def backoff(attempt: int) -> float:
    """The pause before retry `attempt` (1-based) when the server named none."""
    return min(8.0, 0.25 * (2 ** (attempt - 1))) * (0.5 + random.random() / 2)


def retry_delay(status: int, headers: Mapping[str, str], attempt: int,
                max_retries: int) -> Optional[float]:
    """How long to wait before trying a request again that got `status`, or `None`
    when it must not be retried (not 429/503, retries used up, or a `Retry-After`
    beyond `MAX_RETRY_AFTER`)."""
    if status not in (429, 503) or attempt > max_retries:
        return None
    after = retry_after_seconds(headers)
    if after is None:
        return backoff(attempt)
    if after > MAX_RETRY_AFTER:
        return None
    return after


def encode_files(files: Optional[Mapping[str, FileValue]]) -> Optional[dict[str, Any]]:
    """A request's `files`: text as a string, other bytes as `{"base64": …}`."""
    if files is None:
        return None
    out: dict[str, Any] = {}
    for path, value in files.items():
        if isinstance(value, bytes):
            try:
                text = value.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            if text is None or "\0" in text:
                out[path] = {"base64": base64.b64encode(value).decode("ascii")}
            else:
                out[path] = text
        else:
            out[path] = value
    return out


def session_body(prompt: Optional[str], files: Optional[Mapping[str, FileValue]],
                 fields: Mapping[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = {k: v for k, v in fields.items() if v is not None}
    if prompt is not None:
        body["prompt"] = prompt
    enc = encode_files(files)
    if enc is not None:
        body["files"] = enc
    return body


def seg(value: str) -> str:
    """One path segment, escaped."""
    return quote(value, safe="")


def query(**params: Any) -> dict[str, Any]:
    """Query parameters without the absent ones; lists repeat the key, a mapping is
    `key=value` pairs (`metadata`), datetimes in RFC 3339."""
    out: list[tuple[str, str]] = []
    for k, v in params.items():
        if v is None:
            continue
        if isinstance(v, Mapping):
            out.extend((k, f"{mk}={mv}") for mk, mv in v.items())
        elif isinstance(v, (list, tuple)):
            out.extend((k, str(x)) for x in v)
        elif isinstance(v, bool):
            out.append((k, "true" if v else "false"))
        elif hasattr(v, "isoformat"):
            out.append((k, v.isoformat()))
        else:
            out.append((k, str(v)))
    return out  # type: ignore[return-value]


@dataclass
class Call(Generic[T]):
    """One request and how its answer is read."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Any = None
    json: Any = None
    content: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def model(cls: type[T]) -> Callable[[httpx.Response], T]:
    return lambda r: cls.model_validate_json(r.content)  # type: ignore[attr-defined]


def nothing(r: httpx.Response) -> None:
    """An answer without a body (204)."""
    return None


def raw(r: httpx.Response) -> bytes:
    return r.content


@dataclass
class ResultsPage:
    """A page of `GET /v1/batches/{id}/results`."""

    results: list[m.BatchResult]
    next_after: Optional[str]
    state: str  # complete, more, waiting


def results_page(r: httpx.Response) -> ResultsPage:
    results = [m.BatchResult.model_validate_json(line)
               for line in r.content.splitlines() if line.strip()]
    return ResultsPage(results, r.headers.get("agentq-next"),
                       r.headers.get("agentq-results", "complete"))


def jsonl_chunks(items: Iterable[Mapping[str, Any]]) -> Iterator[bytes]:
    for item in items:
        yield json.dumps(item, separators=(",", ":")).encode() + b"\n"


def file_chunks(path: Union[str, os.PathLike[str]], size: int = 1 << 16) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


def sync_stream(chunks: Iterator[bytes]) -> Iterator[bytes]:
    return chunks


async def async_stream(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    # The chunks are small reads of a local file or encoded items: read in the loop.
    for chunk in chunks:
        yield chunk


class Ops:
    """Every operation of the API as a `Call`; the clients send them."""

    @staticmethod
    def create_session(body: dict[str, Any]) -> Call[m.SessionRef]:
        return Call("POST", "/v1/sessions", model(m.SessionRef), json=body)

    @staticmethod
    def get_session(id: str) -> Call[m.SessionDetail]:
        return Call("GET", f"/v1/sessions/{seg(id)}", model(m.SessionDetail))

    @staticmethod
    def list_sessions(**params: Any) -> Call[m.SessionPage]:
        return Call("GET", "/v1/sessions", model(m.SessionPage), params=query(**params))

    @staticmethod
    def count_sessions(**params: Any) -> Call[m.SessionCounts]:
        return Call("GET", "/v1/sessions/counts", model(m.SessionCounts), params=query(**params))

    @staticmethod
    def costs(**params: Any) -> Call[m.CostReport]:
        return Call("GET", "/v1/admin/costs", model(m.CostReport), params=query(**params))

    @staticmethod
    def operations() -> Call[m.Operations]:
        return Call("GET", "/v1/admin/operations", model(m.Operations))

    @staticmethod
    def retention_rules() -> Call[m.RetentionRules]:
        return Call("GET", "/v1/admin/retention", model(m.RetentionRules))

    @staticmethod
    def set_retention(kind: str, name: str, body: dict[str, Any]) -> Call[m.RetentionRule]:
        return Call("PUT", f"/v1/admin/retention/{kind}/{seg(name)}", model(m.RetentionRule),
                    json=body)

    @staticmethod
    def delete_retention(kind: str, name: str) -> Call[None]:
        return Call("DELETE", f"/v1/admin/retention/{kind}/{seg(name)}", nothing)

    @staticmethod
    def cancel_session(id: str) -> Call[m.CancelResult]:
        return Call("POST", f"/v1/sessions/{seg(id)}/cancel", model(m.CancelResult))

    @staticmethod
    def cancel_sessions(body: dict[str, Any]) -> Call[m.BulkCancelResult]:
        return Call("POST", "/v1/sessions/cancel", model(m.BulkCancelResult), json=body)

    @staticmethod
    def retry_session(id: str) -> Call[m.RetryResult]:
        return Call("POST", f"/v1/sessions/{seg(id)}/retry", model(m.RetryResult))

    @staticmethod
    def fork_session(id: str, body: dict[str, Any]) -> Call[m.ForkResult]:
        return Call("POST", f"/v1/sessions/{seg(id)}/fork", model(m.ForkResult), json=body)

    @staticmethod
    def retry_sessions(body: dict[str, Any]) -> Call[m.BulkRetryResult]:
        return Call("POST", "/v1/sessions/retry", model(m.BulkRetryResult), json=body)

    @staticmethod
    def messages(id: str) -> Call[m.MessageList]:
        return Call("GET", f"/v1/sessions/{seg(id)}/messages", model(m.MessageList))

    @staticmethod
    def post_message(id: str, body: dict[str, Any]) -> Call[m.PostMessageResult]:
        return Call("POST", f"/v1/sessions/{seg(id)}/messages", model(m.PostMessageResult),
                    json=body)

    @staticmethod
    def decide(id: str, body: dict[str, Any]) -> Call[m.ApprovalResult]:
        return Call("POST", f"/v1/sessions/{seg(id)}/approvals", model(m.ApprovalResult),
                    json=body)

    @staticmethod
    def list_approvals(**params: Any) -> Call[m.ApprovalPage]:
        return Call("GET", "/v1/approvals", model(m.ApprovalPage), params=query(**params))

    @staticmethod
    def list_files(id: str) -> Call[m.FileList]:
        return Call("GET", f"/v1/sessions/{seg(id)}/files", model(m.FileList))

    @staticmethod
    def download_file(id: str, path: str) -> Call[bytes]:
        # `/` stays a separator: the route takes the rest of the path.
        return Call("GET", f"/v1/sessions/{seg(id)}/files/{quote(path, safe='/')}", raw,
                    headers={"accept": "*/*"})

    @staticmethod
    def download_tar(id: str) -> Call[bytes]:
        return Call("GET", f"/v1/sessions/{seg(id)}/files", raw, params={"format": "tar"},
                    headers={"accept": "application/x-tar"})

    @staticmethod
    def create_webhook(body: dict[str, Any]) -> Call[m.Webhook]:
        return Call("POST", "/v1/webhooks", model(m.Webhook), json=body)

    @staticmethod
    def list_webhooks() -> Call[m.WebhookList]:
        return Call("GET", "/v1/webhooks", model(m.WebhookList))

    @staticmethod
    def get_webhook(id: str) -> Call[m.Webhook]:
        return Call("GET", f"/v1/webhooks/{seg(id)}", model(m.Webhook))

    @staticmethod
    def delete_webhook(id: str) -> Call[None]:
        return Call("DELETE", f"/v1/webhooks/{seg(id)}", nothing)

    @staticmethod
    def rotate_webhook_secret(id: str, body: dict[str, Any]) -> Call[m.Webhook]:
        return Call("POST", f"/v1/webhooks/{seg(id)}/rotate", model(m.Webhook), json=body)

    @staticmethod
    def enable_webhook(id: str) -> Call[m.Webhook]:
        return Call("POST", f"/v1/webhooks/{seg(id)}/enable", model(m.Webhook), json={})

    @staticmethod
    def list_deliveries(id: str, **params: Any) -> Call[m.DeliveryPage]:
        return Call("GET", f"/v1/webhooks/{seg(id)}/deliveries", model(m.DeliveryPage),
                    params=query(**params))

    @staticmethod
    def redrive_webhook(id: str) -> Call[m.Redriven]:
        return Call("POST", f"/v1/webhooks/{seg(id)}/redrive", model(m.Redriven), json={})

    @staticmethod
    def create_schedule(body: dict[str, Any]) -> Call[m.Schedule]:
        return Call("POST", "/v1/schedules", model(m.Schedule), json=body)

    @staticmethod
    def list_schedules(limit: Optional[int], cursor: Optional[str]) -> Call[m.SchedulePage]:
        return Call("GET", "/v1/schedules", model(m.SchedulePage),
                    params=query(limit=limit, cursor=cursor))

    @staticmethod
    def get_schedule(id: str) -> Call[m.Schedule]:
        return Call("GET", f"/v1/schedules/{seg(id)}", model(m.Schedule))

    @staticmethod
    def delete_schedule(id: str) -> Call[None]:
        return Call("DELETE", f"/v1/schedules/{seg(id)}", nothing)

    @staticmethod
    def pause_schedule(id: str) -> Call[m.Schedule]:
        return Call("POST", f"/v1/schedules/{seg(id)}/pause", model(m.Schedule), json={})

    @staticmethod
    def resume_schedule(id: str) -> Call[m.Schedule]:
        return Call("POST", f"/v1/schedules/{seg(id)}/resume", model(m.Schedule), json={})

    @staticmethod
    def trigger_schedule(id: str) -> Call[m.Fire]:
        return Call("POST", f"/v1/schedules/{seg(id)}/trigger", model(m.Fire), json={})

    @staticmethod
    def list_schedule_fires(id: str, limit: Optional[int], cursor: Optional[str]
                            ) -> Call[m.FirePage]:
        return Call("GET", f"/v1/schedules/{seg(id)}/fires", model(m.FirePage),
                    params=query(limit=limit, cursor=cursor))

    @staticmethod
    def submit_batch(body: dict[str, Any]) -> Call[m.Batch]:
        return Call("POST", "/v1/batches", model(m.Batch), json=body)

    @staticmethod
    def upload_batch(content: Any, max_running: Optional[int],
                     metadata: Optional[Mapping[str, Any]]) -> Call[m.Batch]:
        params = query(max_running=max_running,
                       metadata=None if metadata is None else json.dumps(metadata))
        return Call("POST", "/v1/batches", model(m.Batch), params=params, content=content,
                    headers={"content-type": "application/x-ndjson"})

    @staticmethod
    def get_batch(id: str) -> Call[m.Batch]:
        return Call("GET", f"/v1/batches/{seg(id)}", model(m.Batch))

    @staticmethod
    def list_batches(limit: Optional[int], cursor: Optional[str]) -> Call[m.BatchPage]:
        return Call("GET", "/v1/batches", model(m.BatchPage),
                    params=query(limit=limit, cursor=cursor))

    @staticmethod
    def cancel_batch(id: str) -> Call[m.Batch]:
        return Call("POST", f"/v1/batches/{seg(id)}/cancel", model(m.Batch))

    @staticmethod
    def batch_results(id: str, after: Optional[str], limit: Optional[int]) -> Call[ResultsPage]:
        return Call("GET", f"/v1/batches/{seg(id)}/results", results_page,
                    params=query(after=after, limit=limit),
                    headers={"accept": "application/x-ndjson"})

    @staticmethod
    def openapi() -> Call[Any]:
        return Call("GET", "/openapi.json", lambda r: r.json())


def batch_body(requests: Iterable[Mapping[str, Any]], max_running: Optional[int],
               metadata: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {"requests": [dict(r) for r in requests]}
    if max_running is not None:
        body["max_running"] = max_running
    if metadata is not None:
        body["metadata"] = dict(metadata)
    return body


def filter_body(**fields: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if v is None:
            continue
        out[k] = v.isoformat() if hasattr(v, "isoformat") else v
    return out


class SSEDecoder:
    """Server-sent events from lines (without their line ends): an event is dispatched
    at a blank line; a partial event when the stream ends is dropped, as the standard
    says, so a cut connection never yields half an event."""

    def __init__(self) -> None:
        self._id: Optional[str] = None
        self._event: Optional[str] = None
        self._data: list[str] = []
        self.retry_ms: Optional[int] = None

    def feed(self, line: str) -> Optional[m.Event]:
        if line == "":
            if not self._data and self._event is None and self._id is None:
                return None
            ev = m.Event.parse(self._id, self._event, "\n".join(self._data))
            self._id, self._event, self._data = None, None, []
            return ev
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        elif name == "retry" and value.isdigit():
            self.retry_ms = int(value)
        return None


@dataclass
class StreamState:
    """Where an event stream stands across its reconnects."""

    last_id: Optional[str] = None
    failures: int = 0
    done: bool = False
    max_reconnects: int = DEFAULT_MAX_RECONNECTS

    def headers(self) -> dict[str, str]:
        h = {"accept": "text/event-stream", "cache-control": "no-cache"}
        if self.last_id:
            h["last-event-id"] = self.last_id
        return h

    def seen(self, ev: m.Event) -> None:
        if ev.id:
            self.last_id = ev.id
        self.failures = 0
        if ev.event == "session_completed":
            self.done = True

    def dropped(self, cause: Optional[BaseException]) -> float:
        """The pause before reconnecting after a drop; raises once `max_reconnects`
        reconnects in a row brought nothing."""
        self.failures += 1
        if self.failures > self.max_reconnects:
            raise StreamError(
                f"event stream dropped {self.failures} times in a row without an event"
            ) from cause
        return 0.0 if self.failures == 1 else backoff(self.failures - 1)


#: Errors of a connection (not of the server's answer) that a retry may cure.
TRANSPORT_ERRORS = (httpx.TransportError,)


def deadline_after(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else time.monotonic() + timeout


def check_deadline(deadline: Optional[float], what: str) -> None:
    if deadline is not None and time.monotonic() >= deadline:
        raise WaitTimeout(f"timed out waiting for {what}")
