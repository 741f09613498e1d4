"""The blocking client: sends the `Call`s of `_core.Ops` with httpx."""

from __future__ import annotations

import os
import time
from typing import Any, Iterable, Iterator, Mapping, Optional, TypeVar, Union

import httpx

from . import _core as c
from . import models as m

T = TypeVar("T")


class Client:
    """The agentq API. `url` and `api_key` default to `AGENTQ_URL` and
    `AGENTQ_API_KEY`."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: float = 30.0, max_retries: int = c.DEFAULT_MAX_RETRIES,
                 max_reconnects: int = c.DEFAULT_MAX_RECONNECTS,
                 transport: Optional[httpx.BaseTransport] = None) -> None:
        self.url, key = c.env_settings(url, api_key)
        self.max_retries = max_retries
        self.max_reconnects = max_reconnects
        self._http = httpx.Client(base_url=self.url, headers=c.headers_for(key),
                                  timeout=timeout, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # The one place requests are sent: 429/503 and refused connections are retried.
    def _send(self, call: c.Call[T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                r = self._http.request(call.method, call.path, params=call.params,
                                       json=call.json, content=call.content,
                                       headers=call.headers)
            except httpx.ConnectError:
                if attempt > self.max_retries or call.content is not None:
                    raise
                time.sleep(c.backoff(attempt))
                continue
            if r.is_success:
                return call.parse(r)
            # A streamed upload cannot be sent twice.
            delay = None if call.content is not None else c.retry_delay(
                r.status_code, r.headers, attempt, self.max_retries)
            if delay is None:
                raise c.APIError.from_response(r.status_code, r.headers, r.content)
            time.sleep(delay)

    # Sessions

    def create_session(self, prompt: str, *, files: Optional[Mapping[str, c.FileValue]] = None,
                       **fields: Any) -> m.SessionRef:
        """Queue a session; `files` (path → text or bytes) start its workspace; any
        other field of `CreateSession` (`mode`, `tools`, `queue`, `metadata`, …) by name."""
        return self._send(c.Ops.create_session(c.session_body(prompt, files, fields)))

    def get_session(self, id: str) -> m.SessionDetail:
        return self._send(c.Ops.get_session(id))

    def list_sessions(self, **filters: Any) -> m.SessionPage:
        """One page: `status`, `limit`, `cursor`, `parent_id`, `batch_id`, and on newer
        servers `finish_reason`, `wait_reason`, `queue`, `metadata` (a mapping),
        `created_after`, `created_before`, `min_cost_usd`, `max_cost_usd`."""
        return self._send(c.Ops.list_sessions(**filters))

    def iter_sessions(self, **filters: Any) -> Iterator[m.SessionView]:
        """Every matching session, following the cursors."""
        cursor = filters.pop("cursor", None)
        while True:
            page = self.list_sessions(cursor=cursor, **filters)
            yield from page.sessions
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def count_sessions(self, **filters: Any) -> m.SessionCounts:
        """How many sessions `list_sessions`' filters (without `limit` and `cursor`)
        select, per status and per wait reason; `q` searches ids and prompts, `tenant`
        (an admin key) names a tenant."""
        return self._send(c.Ops.count_sessions(**filters))

    def costs(self, *, since: Optional[Any] = None, until: Optional[Any] = None,
              tenant: Optional[str] = None) -> m.CostReport:
        """Tokens and dollars per tenant, model and day (an admin key): the sessions
        created in `[since, until)`, at most 366 days."""
        return self._send(c.Ops.costs(since=since, until=until, tenant=tenant))

    def operations(self) -> m.Operations:
        """Queues (length, pending, held), sessions waiting by reason and the workers
        holding leases (an admin key)."""
        return self._send(c.Ops.operations())

    def retention_rules(self) -> m.RetentionRules:
        """The retention in force (an admin key): the global rule and each tenant's and
        queue's, stored or configured."""
        return self._send(c.Ops.retention_rules())

    def set_tenant_retention(self, tenant: str, days: int, *,
                             keep: Optional[str] = None) -> m.RetentionRule:
        """Store a tenant's retention (an admin key): its finished trees go `days` after
        they finished, keeping `keep` (`none` or `result`). It replaces the configured
        rule of the tenant from the next retention pass on."""
        return self._send(c.Ops.set_retention(
            "tenants", tenant, c.filter_body(days=days, keep=keep)))

    def delete_tenant_retention(self, tenant: str) -> None:
        """Drop a tenant's stored retention; its configured rule applies again."""
        self._send(c.Ops.delete_retention("tenants", tenant))

    def set_queue_retention(self, queue: str, days: int, *,
                            keep: Optional[str] = None) -> m.RetentionRule:
        """Store a queue's retention (an admin key); a tenant's rule still wins."""
        return self._send(c.Ops.set_retention(
            "queues", queue, c.filter_body(days=days, keep=keep)))

    def delete_queue_retention(self, queue: str) -> None:
        """Drop a queue's stored retention; its configured rule applies again."""
        self._send(c.Ops.delete_retention("queues", queue))

    def cancel_session(self, id: str) -> m.CancelResult:
        return self._send(c.Ops.cancel_session(id))

    def cancel_sessions(self, batch_id: str, *, cursor: Optional[str] = None,
                        limit: Optional[int] = None) -> m.BulkCancelResult:
        return self._send(c.Ops.cancel_sessions(
            c.filter_body(batch_id=batch_id, cursor=cursor, limit=limit)))

    def retry_session(self, id: str) -> m.RetryResult:
        return self._send(c.Ops.retry_session(id))

    def fork(self, id: str, at_iteration: int, *, message: Optional[str] = None,
             model: Optional[str] = None, tools: Optional[list[str]] = None,
             token_budget: Optional[int] = None) -> m.ForkResult:
        """A new session whose history is this one's first `at_iteration` iterations
        (shared, not re-run), then `message`; `model`, `tools` and `token_budget` override
        the original's spec (held to the tenant's policy). The original never changes."""
        return self._send(c.Ops.fork_session(id, c.filter_body(
            at_iteration=at_iteration, message=message, model=model, tools=tools,
            token_budget=token_budget)))

    def retry_sessions(self, **filter: Any) -> m.BulkRetryResult:
        """Redrive failed sessions: `batch_id`, `error_contains`, `finished_since`,
        `status` (newer servers), `limit`, `cursor`."""
        return self._send(c.Ops.retry_sessions(c.filter_body(**filter)))

    def messages(self, id: str) -> list[m.Message]:
        return self._send(c.Ops.messages(id)).messages

    def post_message(self, id: str, content: str, *, strategy: Optional[str] = None
                     ) -> m.PostMessageResult:
        return self._send(c.Ops.post_message(id, c.filter_body(content=content,
                                                                strategy=strategy)))

    def approve(self, id: str, tool_call_id: str, *,
                arguments: Optional[Mapping[str, Any]] = None) -> m.ApprovalResult:
        """Approve a held call; `arguments` (newer servers) replace the model's."""
        return self._send(c.Ops.decide(id, c.filter_body(
            tool_call_id=tool_call_id, approve=True, arguments=arguments)))

    def deny(self, id: str, tool_call_id: str, *, reason: Optional[str] = None
             ) -> m.ApprovalResult:
        return self._send(c.Ops.decide(id, c.filter_body(
            tool_call_id=tool_call_id, approve=False, reason=reason)))

    def list_approvals(self, **filters: Any) -> m.ApprovalPage:
        """Held calls across sessions (newer servers): `queue`, `batch_id`, `tool`,
        `session_id`, `limit`, `cursor`."""
        return self._send(c.Ops.list_approvals(**filters))

    # Files

    def list_files(self, id: str) -> list[m.FileEntry]:
        return self._send(c.Ops.list_files(id)).files

    def download_file(self, id: str, path: str) -> bytes:
        return self._send(c.Ops.download_file(id, path))

    def download_tar(self, id: str) -> bytes:
        """Every committed file of the session's tree, as one tar."""
        return self._send(c.Ops.download_tar(id))

    # Events

    def events(self, id: str, *, last_event_id: Optional[str] = None,
               timeout: Optional[float] = None) -> Iterator[m.Event]:
        """The session's events until `session_completed`, resuming after a dropped
        connection from the last event's id: nothing is lost or repeated."""
        state = c.StreamState(last_id=last_event_id, max_reconnects=self.max_reconnects)
        deadline = c.deadline_after(timeout)
        path = f"/v1/sessions/{c.seg(id)}/events"
        attempt = 0
        while not state.done:
            c.check_deadline(deadline, f"the events of {id}")
            cause: Optional[BaseException] = None
            try:
                with self._http.stream("GET", path, headers=state.headers(),
                                       timeout=httpx.Timeout(30.0, read=None)) as r:
                    if not r.is_success:
                        r.read()
                        attempt += 1
                        delay = c.retry_delay(r.status_code, r.headers, attempt,
                                              self.max_retries)
                        if delay is None:
                            raise c.APIError.from_response(r.status_code, r.headers,
                                                           r.content)
                        time.sleep(delay)
                        continue
                    attempt = 0
                    decoder = c.SSEDecoder()
                    for line in r.iter_lines():
                        c.check_deadline(deadline, f"the events of {id}")
                        ev = decoder.feed(line)
                        if ev is None:
                            continue
                        state.seen(ev)
                        yield ev
                        if state.done:
                            return
            except c.TRANSPORT_ERRORS as e:
                cause = e
            time.sleep(state.dropped(cause))

    def wait(self, id: str, *, timeout: Optional[float] = None,
             poll_interval: Optional[float] = None) -> m.SessionDetail:
        """The session once it has finished: followed through its events, or polled
        every `poll_interval` seconds when one is given."""
        deadline = c.deadline_after(timeout)
        if poll_interval is None:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            for _ in self.events(id, timeout=remaining):
                pass
            poll_interval = 0.2
        while True:
            s = self.get_session(id)
            if s.finished:
                return s
            c.check_deadline(deadline, f"session {id}")
            time.sleep(poll_interval)

    # Batches

    def submit_batch(self, requests: Iterable[Mapping[str, Any]], *,
                     max_running: Optional[int] = None,
                     metadata: Optional[Mapping[str, Any]] = None) -> m.Batch:
        """A batch from a list of session requests (each as `create_session` takes it,
        with an optional `custom_id`), sent as one JSON body."""
        return self._send(c.Ops.submit_batch(c.batch_body(requests, max_running, metadata)))

    def upload_batch(self, source: Union[str, os.PathLike[str], Iterable[Mapping[str, Any]]], *,
                     max_running: Optional[int] = None,
                     metadata: Optional[Mapping[str, Any]] = None) -> m.Batch:
        """A batch as JSON Lines, streamed: a file's path, or an iterable of requests
        (never held in memory whole)."""
        chunks = (c.file_chunks(source) if isinstance(source, (str, os.PathLike))
                  else c.jsonl_chunks(source))
        content = c.sync_stream(chunks)
        return self._send(c.Ops.upload_batch(content, max_running, metadata))

    def get_batch(self, id: str) -> m.Batch:
        return self._send(c.Ops.get_batch(id))

    def list_batches(self, *, limit: Optional[int] = None, cursor: Optional[str] = None
                     ) -> m.BatchPage:
        return self._send(c.Ops.list_batches(limit, cursor))

    def iter_batches(self, *, limit: Optional[int] = None) -> Iterator[m.Batch]:
        cursor = None
        while True:
            page = self.list_batches(limit=limit, cursor=cursor)
            yield from page.batches
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def cancel_batch(self, id: str) -> m.Batch:
        return self._send(c.Ops.cancel_batch(id))

    def batch_results(self, id: str, *, wait: bool = True, poll_interval: float = 0.5,
                      limit: Optional[int] = None, after: Optional[str] = None,
                      timeout: Optional[float] = None) -> Iterator[m.BatchResult]:
        """The batch's results in request order, across pages; with `wait`, until the
        last session finished (polling while the next one runs), else what is ready."""
        deadline = c.deadline_after(timeout)
        while True:
            page = self._send(c.Ops.batch_results(id, after, limit))
            yield from page.results
            if page.results:
                after = page.results[-1].id
            if page.next_after:
                after = page.next_after
            if page.state == "complete" or (page.state == "waiting" and not wait):
                return
            if page.state == "waiting":
                c.check_deadline(deadline, f"the results of batch {id}")
                time.sleep(poll_interval)

    def wait_batch(self, id: str, *, timeout: Optional[float] = None,
                   poll_interval: float = 0.5) -> m.Batch:
        deadline = c.deadline_after(timeout)
        while True:
            b = self.get_batch(id)
            if b.finished:
                return b
            c.check_deadline(deadline, f"batch {id}")
            time.sleep(poll_interval)

    # Webhooks (verify a delivery with `agentq_client.webhooks.verify`)

    def create_webhook(self, url: str, events: Iterable[str], *, queue: Optional[str] = None,
                       batch_id: Optional[str] = None,
                       description: Optional[str] = None) -> m.Webhook:
        """Register an endpoint for `events` (`session.completed`, `session.failed`,
        `session.waiting`, `batch.completed`); the answer's `secret` is shown only here."""
        return self._send(c.Ops.create_webhook(c.filter_body(
            url=url, events=list(events), queue=queue, batch_id=batch_id,
            description=description)))

    def list_webhooks(self) -> list[m.Webhook]:
        return self._send(c.Ops.list_webhooks()).webhooks

    def get_webhook(self, id: str) -> m.Webhook:
        return self._send(c.Ops.get_webhook(id))

    def delete_webhook(self, id: str) -> None:
        """The endpoint and its deliveries, sent or not."""
        self._send(c.Ops.delete_webhook(id))

    def rotate_webhook_secret(self, id: str, *, overlap_secs: Optional[int] = None
                              ) -> m.Webhook:
        """A new `secret` (in this answer only); the old one signs too for `overlap_secs`
        (a day when absent)."""
        return self._send(c.Ops.rotate_webhook_secret(id, c.filter_body(
            overlap_secs=overlap_secs)))

    def enable_webhook(self, id: str) -> m.Webhook:
        """Send again to an endpoint disabled after failing for too long."""
        return self._send(c.Ops.enable_webhook(id))

    def list_deliveries(self, id: str, *, state: Optional[str] = None,
                        limit: Optional[int] = None, cursor: Optional[str] = None
                        ) -> m.DeliveryPage:
        """One page of the endpoint's deliveries, newest first; `state="dead"` gives its
        dead letters."""
        return self._send(c.Ops.list_deliveries(id, state=state, limit=limit, cursor=cursor))

    def iter_deliveries(self, id: str, *, state: Optional[str] = None,
                        limit: Optional[int] = None) -> Iterator[m.Delivery]:
        cursor = None
        while True:
            page = self.list_deliveries(id, state=state, limit=limit, cursor=cursor)
            yield from page.deliveries
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def redrive_webhook(self, id: str) -> m.Redriven:
        """Queue the endpoint's dead letters again (it must be enabled)."""
        return self._send(c.Ops.redrive_webhook(id))

    # Schedules

    def create_schedule(self, session: Mapping[str, Any], *, cron: Optional[str] = None,
                        timezone: Optional[str] = None, every_secs: Optional[int] = None,
                        overlap: Optional[str] = None,
                        catchup_window_secs: Optional[int] = None,
                        description: Optional[str] = None,
                        paused: Optional[bool] = None) -> m.Schedule:
        """A session from `session` (what `create_session` sends, as a dict) at each time
        of `cron` in `timezone`, or every `every_secs` seconds; `overlap` is `skip`,
        `buffer_one`, `cancel_other` or `allow_all`."""
        return self._send(c.Ops.create_schedule(c.filter_body(
            cron=cron, timezone=timezone, every_secs=every_secs, session=dict(session),
            overlap=overlap, catchup_window_secs=catchup_window_secs,
            description=description, paused=paused)))

    def list_schedules(self, *, limit: Optional[int] = None,
                       cursor: Optional[str] = None) -> m.SchedulePage:
        return self._send(c.Ops.list_schedules(limit, cursor))

    def get_schedule(self, id: str) -> m.Schedule:
        return self._send(c.Ops.get_schedule(id))

    def delete_schedule(self, id: str) -> None:
        """The schedule and its history (its sessions stay)."""
        self._send(c.Ops.delete_schedule(id))

    def pause_schedule(self, id: str) -> m.Schedule:
        return self._send(c.Ops.pause_schedule(id))

    def resume_schedule(self, id: str) -> m.Schedule:
        """Fire again from the next time after now."""
        return self._send(c.Ops.resume_schedule(id))

    def trigger_schedule(self, id: str) -> m.Fire:
        """One fire now, under the schedule's overlap policy."""
        return self._send(c.Ops.trigger_schedule(id))

    def list_schedule_fires(self, id: str, *, limit: Optional[int] = None,
                            cursor: Optional[str] = None) -> m.FirePage:
        """One page of the schedule's fires, newest first."""
        return self._send(c.Ops.list_schedule_fires(id, limit, cursor))

    def openapi(self) -> Any:
        return self._send(c.Ops.openapi())
