"""Typed views of the API's answers, written to match api/openapi.json.

Each model names the spec schema it mirrors (`__schema__`); tests/test_models.py holds
every model's fields to that schema's properties (and its required ones), so a change of
the spec that these models do not follow fails the suite. Unknown fields from a newer
server are kept (`extra="allow"`) rather than refused: an old client keeps working.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, ClassVar, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

SessionStatus = Literal[
    "queued", "running", "waiting", "awaiting_approval", "completed", "failed", "cancelled"
]
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})
BatchStatus = Literal["in_progress", "completed", "cancelling", "cancelled"]


class Model(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    __schema__: ClassVar[str] = ""


class Usage(Model):
    __schema__ = "Usage"
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    web_search_requests: int = 0


class ErrorDetail(Model):
    __schema__ = "ErrorDetail"
    code: str
    message: str
    field: Optional[str] = None


class SessionRef(Model):
    __schema__ = "SessionRef"
    id: str
    status: SessionStatus


class SessionSpec(Model):
    """The request's fields as a session shows them (the server fills its defaults)."""

    __schema__ = "SessionSpec"
    prompt: str
    approval_timeout_secs: Optional[int] = None
    base_url: Optional[str] = None
    context_budget_chars: Optional[int] = None
    history_window: Optional[int] = None
    max_background_drain_rounds: Optional[int] = None
    max_iterations: Optional[int] = None
    max_llm_retries: Optional[int] = None
    max_repeated_calls: Optional[int] = None
    max_tokens: Optional[int] = None
    metadata: Any = None
    mode: Optional[str] = None
    model: Optional[str] = None
    provider: Optional[str] = None
    retry_delay_ms: Optional[int] = None
    sensitive_tools: Optional[list[str]] = None
    system: Optional[str] = None
    temperature: Optional[float] = None
    timeout_secs: Optional[int] = None
    token_budget: Optional[int] = None
    tool_output_max_chars: Optional[int] = None
    tool_timeout_secs: Optional[int] = None
    tools: Optional[list[str]] = None
    warn_repeated_calls: Optional[int] = None
    web_search: Any = None


class SessionView(SessionSpec):
    __schema__ = "SessionView"
    id: str
    status: SessionStatus
    iterations: int
    usage: Usage
    root_id: str
    depth: int
    queue: str
    cancel_requested: bool
    attempts: int
    created_at: datetime
    updated_at: datetime
    batch_id: Optional[str] = None
    error: Optional[str] = None
    finish_reason: Optional[str] = None
    finished_at: Optional[datetime] = None
    idempotency_key: Optional[str] = None
    lease_owner: Optional[str] = None
    parent_id: Optional[str] = None
    priority: Optional[int] = None
    result: Optional[str] = None
    takeovers: Optional[int] = None
    wait_reason: Optional[str] = None
    wake_at: Optional[datetime] = None
    forked_from: Optional[str] = None
    fork_at: Optional[int] = None

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL_STATUSES


class PendingApproval(Model):
    __schema__ = "PendingApproval"
    tool_call_id: str
    tool: str
    arguments: Any
    deadline: Optional[datetime] = None


class BudgetLedger(Model):
    __schema__ = "BudgetLedger"
    allowance: int
    spent: int
    held: int
    children_spent: int
    remaining: int


class TreeCost(Model):
    __schema__ = "TreeCost"
    root_id: str
    sessions: int
    input_tokens: int
    output_tokens: int
    cost_usd: float


class SessionDetail(SessionView):
    __schema__ = "SessionDetail"
    children: list[str]
    budget: Optional[BudgetLedger] = None
    cost_usd: Optional[float] = None
    pending_approvals: list[PendingApproval] = Field(default_factory=list)
    tree_cost: Optional[TreeCost] = None


class SessionPage(Model):
    __schema__ = "ListResponse"
    sessions: list[SessionView]
    next_cursor: Optional[str] = None
    cost_usd: Optional[float] = None


class CancelResult(Model):
    __schema__ = "CancelResponse"
    id: str
    status: SessionStatus
    cancel_requested: Optional[bool] = None


class RetryResult(Model):
    __schema__ = "RetryResponse"
    id: str
    status: SessionStatus


class ForkResult(Model):
    __schema__ = "ForkResponse"
    id: str
    status: SessionStatus
    forked_from: str
    at_iteration: int


class BulkCancelResult(Model):
    __schema__ = "BulkCancelResponse"
    sessions: list[CancelResult]
    next_cursor: Optional[str] = None


class BulkRetryResult(Model):
    __schema__ = "BulkRetryResponse"
    sessions: list[RetryResult]
    next_cursor: Optional[str] = None


class ApprovalResult(Model):
    __schema__ = "ApprovalResponse"
    id: str
    tool_call_id: str
    approve: bool
    resumed: bool


class Approval(Model):
    """One held call of `GET /v1/approvals` (a server that has the route)."""

    __schema__ = "ApprovalItem"
    session_id: str
    tool_call_id: str
    tool: str
    arguments: Any = None
    requested_at: Optional[datetime] = None
    deadline: Optional[datetime] = None
    queue: Optional[str] = None
    batch_id: Optional[str] = None
    metadata: Any = None


class ApprovalPage(Model):
    __schema__ = "ApprovalList"
    approvals: list[Approval]
    next_cursor: Optional[str] = None


class ToolCall(Model):
    __schema__ = "ToolCall"
    id: str
    name: str
    arguments: Any


class Message(Model):
    __schema__ = "Message"
    role: str
    content: Optional[str] = None
    edited_arguments: Optional[Any] = None
    finish_reason: Optional[str] = None
    is_error: Optional[bool] = None
    model: Optional[str] = None
    name: Optional[str] = None
    server_content: Optional[list[Any]] = None
    thinking: Optional[list[Any]] = None
    tool_call_id: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    usage: Optional[Usage] = None


class MessageList(Model):
    __schema__ = "MessagesResponse"
    messages: list[Message]


class PostMessageResult(Model):
    __schema__ = "PostMessageResponse"
    id: str
    status: SessionStatus
    delivery: str
    seq: Optional[int] = None


class FileEntry(Model):
    __schema__ = "FileEntry"
    path: str
    size: int
    sha256: str
    modified_at_seq: int


class FileList(Model):
    __schema__ = "FileList"
    files: list[FileEntry]


class BatchCounts(Model):
    __schema__ = "BatchCounts"
    queued: int
    running: int
    waiting: int
    awaiting_approval: int
    completed: int
    failed: int
    cancelled: int


class Batch(Model):
    __schema__ = "BatchView"
    id: str
    status: BatchStatus
    total: int
    counts: BatchCounts
    finish_reasons: dict[str, int]
    usage: Usage
    metadata: Any
    created_at: datetime
    cancelled_at: Optional[datetime] = None
    cost_usd: Optional[float] = None
    eta_secs: Optional[int] = None
    finished_at: Optional[datetime] = None
    max_running: Optional[int] = None
    started_at: Optional[datetime] = None

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "cancelled")


class BatchPage(Model):
    __schema__ = "BatchList"
    batches: list[Batch]
    next_cursor: Optional[str] = None


class BatchResult(Model):
    __schema__ = "BatchResult"
    id: str
    status: SessionStatus
    usage: Usage
    custom_id: Optional[str] = None
    error: Optional[str] = None
    finish_reason: Optional[str] = None
    result: Optional[str] = None


class SessionCounts(Model):
    __schema__ = "SessionCounts"
    total: int
    by_status: dict[str, int]
    by_wait_reason: dict[str, int]
    complete: bool


class CostEntry(Model):
    __schema__ = "CostEntry"
    day: str
    tenant: str
    sessions: int
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    reasoning_tokens: int
    web_search_requests: int
    model: Optional[str] = None
    cost_usd: Optional[float] = None


class CostReport(Model):
    __schema__ = "CostReport"
    since: datetime
    until: datetime
    rows: list[CostEntry]
    cost_usd: float
    truncated: bool


class QueueOps(Model):
    __schema__ = "QueueOps"
    name: str
    held: int
    length: Optional[int] = None
    pending: Optional[int] = None
    lag: Optional[int] = None
    error: Optional[str] = None


class WorkerView(Model):
    __schema__ = "WorkerView"
    worker: str
    sessions: int
    first_lease_expiry: Optional[datetime] = None
    last_lease_expiry: Optional[datetime] = None


class Operations(Model):
    __schema__ = "Operations"
    queues: list[QueueOps]
    waiting: dict[str, int]
    workers: list[WorkerView]
    workers_truncated: bool


Keep = Literal["none", "result"]


class RetentionRule(Model):
    """One tenant's or queue's retention in force: stored through the API or
    configured."""

    __schema__ = "RetentionRuleView"
    kind: Literal["tenant", "queue"]
    name: str
    keep: Keep
    source: Literal["stored", "config"]
    days: Optional[int] = None
    updated_at: Optional[datetime] = None


class RetentionRules(Model):
    """The global retention and every tenant's and queue's in force."""

    __schema__ = "RetentionRules"
    keep: Keep
    tenants: list[RetentionRule]
    queues: list[RetentionRule]
    days: Optional[int] = None


WebhookStatus = Literal["enabled", "disabled"]
DeliveryState = Literal["pending", "delivered", "dead"]


class DeliveryCounts(Model):
    __schema__ = "DeliveryCountsView"
    pending: int = 0
    delivered: int = 0
    dead: int = 0


class WebhookFailure(Model):
    __schema__ = "WebhookFailure"
    at: datetime
    error: str


class Webhook(Model):
    """An endpoint. `secret` (`whsec_…`) is set only in the answer of its creation and of
    a rotation: keep it then, it is never shown again."""

    __schema__ = "WebhookView"
    id: str
    url: str
    events: list[str]
    status: WebhookStatus
    counts: DeliveryCounts
    created_at: datetime
    queue: Optional[str] = None
    batch_id: Optional[str] = None
    description: Optional[str] = None
    disabled_at: Optional[datetime] = None
    disabled_reason: Optional[str] = None
    failing_since: Optional[datetime] = None
    last_failure: Optional[WebhookFailure] = None
    last_success_at: Optional[datetime] = None
    previous_secret_expires_at: Optional[datetime] = None
    secret: Optional[str] = None


class WebhookList(Model):
    __schema__ = "WebhookList"
    webhooks: list[Webhook]


class Delivery(Model):
    """One event to one endpoint and its attempts; `id` is the `webhook-id` each carries."""

    __schema__ = "DeliveryView"
    id: str
    event: str
    state: DeliveryState
    attempts: int
    occurred_at: datetime
    session_id: Optional[str] = None
    batch_id: Optional[str] = None
    last_attempt_at: Optional[datetime] = None
    next_attempt_at: Optional[datetime] = None
    last_status: Optional[int] = None
    last_error: Optional[str] = None
    delivered_at: Optional[datetime] = None


class DeliveryPage(Model):
    __schema__ = "DeliveryList"
    deliveries: list[Delivery]
    next_cursor: Optional[str] = None


class Redriven(Model):
    __schema__ = "Redriven"
    requeued: int


class WebhookPayload(Model):
    """The body of a delivery, once verified: `type` is the event (`session.completed`,
    `session.failed`, `session.waiting`, `batch.completed`), `data` its fields as the
    document's `webhooks` describe them."""

    type: str
    timestamp: datetime
    data: dict[str, Any]


class Event(BaseModel):
    """One server-sent event of `GET /v1/sessions/{id}/events`.

    `event` is its kind (`text_delta`, `tool_call`, …, `session_completed`, `reset`),
    `data` its JSON, `id` what resumes the stream after it (`None` for `reset`). A `reset`
    tells the reader to discard what it received for positions `>= seq`.
    """

    model_config = ConfigDict(frozen=True)
    id: Optional[str] = None
    event: str = "message"
    data: Any = None

    @property
    def seq(self) -> Optional[int]:
        return self.data.get("seq") if isinstance(self.data, dict) else None

    @classmethod
    def parse(cls, id: Optional[str], event: Optional[str], data: str) -> "Event":
        try:
            value: Any = json.loads(data)
        except ValueError:
            value = data
        return cls(id=id, event=event or "message", data=value)


ScheduleOverlap = Literal["skip", "buffer_one", "cancel_other", "allow_all"]
FireOutcome = Literal["started", "skipped", "buffered", "missed", "failed"]


class Schedule(Model):
    """A schedule: a session from `session` (the template) at each time of `cron` in
    `timezone`, or every `every_secs` seconds."""

    __schema__ = "ScheduleView"
    id: str
    timezone: str
    session: Any
    overlap: ScheduleOverlap
    catchup_window_secs: int
    paused: bool
    next_fire_at: datetime
    created_at: datetime
    cron: Optional[str] = None
    every_secs: Optional[int] = None
    description: Optional[str] = None
    buffered_fire_at: Optional[datetime] = None
    last_session_id: Optional[str] = None


class SchedulePage(Model):
    __schema__ = "ScheduleList"
    schedules: list[Schedule]
    next_cursor: Optional[str] = None


class Fire(Model):
    """One fire of a schedule: what it did and the session it created."""

    __schema__ = "FireView"
    fire_time: datetime
    outcome: FireOutcome
    manual: bool
    recorded_at: datetime
    session_id: Optional[str] = None
    cancelled_session_id: Optional[str] = None
    error: Optional[str] = None


class FirePage(Model):
    __schema__ = "FireList"
    fires: list[Fire]
    next_cursor: Optional[str] = None
