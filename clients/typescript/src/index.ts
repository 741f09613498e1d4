// The agentq API over fetch: the types are generated from api/openapi.json
// (src/schema.ts, by openapi-typescript); this file is the thin wrapper around them:
// settings from the environment, retries of 429/503 after Retry-After, typed errors, and
// server-sent events that resume from Last-Event-ID after a dropped connection.
// No runtime dependency beyond node 20's built-ins.

import type { components } from "./schema.js";

export type { components, paths, operations } from "./schema.js";

type S = components["schemas"];
export type SessionSpec = S["SessionSpec"];
export type CreateSession = S["CreateSession"];
export type SessionRef = S["SessionRef"];
export type SessionView = S["SessionView"];
export type SessionDetail = S["SessionDetail"];
export type SessionStatus = S["SessionStatus"];
export type SessionPage = S["ListResponse"];
export type SessionFilter = S["SessionFilter"];
export type CancelResult = S["CancelResponse"];
export type RetryResult = S["RetryResponse"];
export type ForkResult = S["ForkResponse"];
export type ForkRequest = S["ForkRequest"];
export type BulkCancelResult = S["BulkCancelResponse"];
export type BulkRetryResult = S["BulkRetryResponse"];
export type ApprovalResult = S["ApprovalResponse"];
export type Message = S["Message"];
export type PostMessageResult = S["PostMessageResponse"];
export type FileEntry = S["FileEntry"];
export type Batch = S["BatchView"];
export type BatchPage = S["BatchList"];
export type BatchResult = S["BatchResult"];
export type BatchRequestItem = S["BatchRequestItem"];
export type ErrorDetail = S["ErrorDetail"];
export type SessionCounts = S["SessionCounts"];
export type CostReport = S["CostReport"];
export type CostEntry = S["CostEntry"];
export type Operations = S["Operations"];
export type Webhook = S["WebhookView"];
export type CreateWebhook = S["CreateWebhook"];
export type Delivery = S["DeliveryView"];
export type DeliveryPage = S["DeliveryList"];
export type Redriven = S["Redriven"];
export type Schedule = S["ScheduleView"];
export type CreateSchedule = S["CreateSchedule"];
export type SchedulePage = S["ScheduleList"];
export type Fire = S["FireView"];
export type FirePage = S["FireList"];
export type RetentionRule = S["RetentionRuleView"];
export type RetentionRules = S["RetentionRules"];
export type SetRetention = S["SetRetention"];

export {
  DEFAULT_TOLERANCE, WebhookVerificationError, signWebhook, verifyWebhook,
} from "./webhooks.js";
export type { WebhookHeaders, WebhookPayload } from "./webhooks.js";

/** One held call of `GET /v1/approvals` (servers that have the route). */
export interface Approval {
  session_id: string;
  tool_call_id: string;
  tool: string;
  arguments: unknown;
  requested_at?: string | null;
  deadline?: string | null;
  queue?: string | null;
  batch_id?: string | null;
  metadata?: unknown;
}
export interface ApprovalPage {
  approvals: Approval[];
  next_cursor?: string | null;
}

/** Filters of `GET /v1/sessions` (the last eight on servers that have them). */
export interface SessionQuery {
  status?: SessionStatus;
  limit?: number;
  cursor?: string;
  parent_id?: string;
  batch_id?: string;
  finish_reason?: string;
  wait_reason?: string;
  queue?: string;
  metadata?: Record<string, string>;
  created_after?: string;
  created_before?: string;
  min_cost_usd?: number;
  max_cost_usd?: number;
  /** Text search: an id prefix or a piece of the prompt (case-insensitive, literal). */
  q?: string;
  /** Another tenant's sessions: for a key with the admin scope. */
  tenant?: string;
}

/** The filters of `GET /v1/sessions/counts`: those of a listing without its paging. */
export type CountQuery = Omit<SessionQuery, "limit" | "cursor">;

/** `GET /v1/admin/costs`: sessions created in `[since, until)` (RFC 3339), at most 366 days. */
export interface CostQuery {
  since?: string;
  until?: string;
  tenant?: string;
}

/** One server-sent event: `event` its kind, `data` its JSON, `id` what resumes after
 * it (`null` for `reset`: discard what was received for positions `>= data.seq`). */
export interface AgentqEvent {
  id: string | null;
  event: string;
  data: any;
}

export const TERMINAL: ReadonlySet<string> = new Set(["completed", "failed", "cancelled"]);
export const DEFAULT_MAX_RETRIES = 5;
/** The longest single `Retry-After` honoured, in seconds; a longer one fails at once. */
export const MAX_RETRY_AFTER = 60;
export const DEFAULT_MAX_RECONNECTS = 8;

/** The server answered with an error: its status and its `{"error": {...}}` body. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
    readonly field: string | null,
    readonly body: unknown,
    readonly retryAfter: number | null,
  ) {
    super(`${status} ${code}: ${message}${field ? ` (field ${field})` : ""}`);
    this.name = "ApiError";
  }

  static async from(resp: Response): Promise<ApiError> {
    const text = await resp.text();
    let body: any = text;
    try {
      body = text ? JSON.parse(text) : null;
    } catch {
      // not JSON: kept as text
    }
    const d = body && typeof body === "object" ? body.error : undefined;
    const retry = retryAfterSeconds(resp.headers);
    if (d && typeof d === "object") {
      return new ApiError(resp.status, String(d.code ?? "unknown"), String(d.message ?? ""),
        d.field ?? null, body, retry);
    }
    return new ApiError(resp.status, `http_${resp.status}`, String(text), null, body, retry);
  }
}

export class StreamError extends Error {}
export class WaitTimeout extends Error {}

export function retryAfterSeconds(headers: Headers): number | null {
  const raw = headers.get("retry-after");
  if (raw === null) return null;
  const t = raw.trim();
  if (/^\d+$/.test(t)) return Number(t);
  const when = Date.parse(t);
  return Number.isNaN(when) ? null : Math.max(0, (when - Date.now()) / 1000);
}

export function backoff(attempt: number): number {
  return Math.min(8, 0.25 * 2 ** (attempt - 1)) * (0.5 + Math.random() / 2);
}

/** Seconds to wait before retrying an answer of `status`, or null when it must not be. */
export function retryDelay(status: number, headers: Headers, attempt: number,
  maxRetries: number): number | null {
  if ((status !== 429 && status !== 503) || attempt > maxRetries) return null;
  const after = retryAfterSeconds(headers);
  if (after === null) return backoff(attempt);
  return after > MAX_RETRY_AFTER ? null : after;
}

const sleep = (s: number) => new Promise<void>((r) => setTimeout(r, s * 1000));

/** Server-sent events from lines; a partial event at the end of a stream is dropped. */
export class SseDecoder {
  private id: string | null = null;
  private event: string | null = null;
  private data: string[] = [];
  private buf = "";

  /** Feed text; the events it completes. */
  push(text: string): AgentqEvent[] {
    this.buf += text;
    const out: AgentqEvent[] = [];
    for (;;) {
      const m = /\r\n|\n|\r/.exec(this.buf);
      // A lone `\r` at the end may be half of `\r\n`: wait for more.
      if (!m || (m[0] === "\r" && m.index === this.buf.length - 1)) break;
      const line = this.buf.slice(0, m.index);
      this.buf = this.buf.slice(m.index + m[0].length);
      const ev = this.line(line);
      if (ev) out.push(ev);
    }
    return out;
  }

  private line(line: string): AgentqEvent | null {
    if (line === "") {
      if (this.data.length === 0 && this.event === null && this.id === null) return null;
      const raw = this.data.join("\n");
      let data: any = raw;
      try {
        data = JSON.parse(raw);
      } catch {
        // plain text data
      }
      const ev = { id: this.id, event: this.event ?? "message", data };
      this.id = null;
      this.event = null;
      this.data = [];
      return ev;
    }
    if (line.startsWith(":")) return null;
    const i = line.indexOf(":");
    const name = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? "" : line.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (name === "data") this.data.push(value);
    else if (name === "event") this.event = value;
    else if (name === "id" && !value.includes("\0")) this.id = value;
    return null;
  }
}

export interface ClientOptions {
  /** Default: `AGENTQ_URL`, else `AGENTQ_API_URL`, else http://127.0.0.1:8080. */
  url?: string;
  /** Default: `AGENTQ_API_KEY`. */
  apiKey?: string;
  maxRetries?: number;
  maxReconnects?: number;
  fetch?: typeof fetch;
}

type Query = Record<string, string | number | boolean | string[] | Record<string, string>
  | undefined | null>;

function queryString(q: Query | undefined): string {
  if (!q) return "";
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(q)) {
    if (v === undefined || v === null) continue;
    if (Array.isArray(v)) v.forEach((x) => p.append(k, x));
    else if (typeof v === "object") Object.entries(v).forEach(([a, b]) => p.append(k, `${a}=${b}`));
    else p.append(k, String(v));
  }
  const s = p.toString();
  return s ? `?${s}` : "";
}

const seg = encodeURIComponent;

interface Req {
  method?: string;
  query?: Query;
  json?: unknown;
  body?: RequestInit["body"];
  headers?: Record<string, string>;
}

export type FileValue = string | Uint8Array;

/** A request's `files`: text as a string, other bytes as `{"base64": ...}`. */
export function encodeFiles(files: Record<string, FileValue>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [path, v] of Object.entries(files)) {
    if (typeof v === "string") {
      out[path] = v;
      continue;
    }
    let text: string | null = null;
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(v);
    } catch {
      text = null;
    }
    out[path] = text !== null && !text.includes("\0")
      ? text : { base64: Buffer.from(v).toString("base64") };
  }
  return out;
}

export class AgentqClient {
  readonly url: string;
  readonly maxRetries: number;
  readonly maxReconnects: number;
  private readonly key: string | undefined;
  private readonly fetch: typeof fetch;

  constructor(opts: ClientOptions = {}) {
    const env = process.env;
    this.url = (opts.url ?? env.AGENTQ_URL ?? env.AGENTQ_API_URL ?? "http://127.0.0.1:8080")
      .replace(/\/+$/, "");
    this.key = opts.apiKey ?? env.AGENTQ_API_KEY ?? undefined;
    this.maxRetries = opts.maxRetries ?? DEFAULT_MAX_RETRIES;
    this.maxReconnects = opts.maxReconnects ?? DEFAULT_MAX_RECONNECTS;
    this.fetch = opts.fetch ?? globalThis.fetch;
  }

  private headers(extra?: Record<string, string>): Record<string, string> {
    const h: Record<string, string> = { accept: "application/json", ...extra };
    if (this.key) h.authorization = `Bearer ${this.key}`;
    return h;
  }

  /** Send one request, retrying 429/503 after Retry-After; the successful response. */
  async send(path: string, req: Req = {}): Promise<Response> {
    const headers = this.headers(req.headers);
    let body = req.body;
    if (req.json !== undefined) {
      body = JSON.stringify(req.json);
      headers["content-type"] = "application/json";
    }
    // A stream can be sent once only.
    const once = body instanceof ReadableStream;
    for (let attempt = 1; ; attempt++) {
      const resp = await this.fetch(this.url + path + queryString(req.query), {
        method: req.method ?? "GET", headers, body,
        ...(once ? { duplex: "half" } : {}),
      } as RequestInit);
      if (resp.ok) return resp;
      const delay = once ? null : retryDelay(resp.status, resp.headers, attempt, this.maxRetries);
      if (delay === null) throw await ApiError.from(resp);
      await resp.body?.cancel();
      await sleep(delay);
    }
  }

  private async json<T>(path: string, req: Req = {}): Promise<T> {
    return (await (await this.send(path, req)).json()) as T;
  }

  // Sessions

  createSession(prompt: string, opts: Omit<CreateSession, "prompt" | "files"> & {
    files?: Record<string, FileValue>;
  } = {}): Promise<SessionRef> {
    const { files, ...fields } = opts;
    const body: Record<string, unknown> = { ...fields, prompt };
    if (files) body.files = encodeFiles(files);
    return this.json("/v1/sessions", { method: "POST", json: body });
  }

  getSession(id: string): Promise<SessionDetail> {
    return this.json(`/v1/sessions/${seg(id)}`);
  }

  listSessions(q: SessionQuery = {}): Promise<SessionPage> {
    return this.json("/v1/sessions", { query: q as Query });
  }

  async *iterSessions(q: SessionQuery = {}): AsyncGenerator<SessionView> {
    let cursor = q.cursor;
    for (;;) {
      const page = await this.listSessions({ ...q, cursor });
      yield* page.sessions;
      if (!page.next_cursor) return;
      cursor = page.next_cursor;
    }
  }

  /** How many sessions `listSessions`' filters select, per status and wait reason. */
  countSessions(q: CountQuery = {}): Promise<SessionCounts> {
    return this.json("/v1/sessions/counts", { query: q as Query });
  }

  /** Tokens and dollars per tenant, model and day (an admin key). */
  costs(q: CostQuery = {}): Promise<CostReport> {
    return this.json("/v1/admin/costs", { query: q as Query });
  }

  /** Queues, sessions waiting by reason, and the workers holding leases (an admin key). */
  operations(): Promise<Operations> {
    return this.json("/v1/admin/operations");
  }

  /** The retention in force (an admin key): the global rule, each tenant's and queue's. */
  retentionRules(): Promise<RetentionRules> {
    return this.json("/v1/admin/retention");
  }

  /**
   * Store a tenant's retention (an admin key): its finished trees go `days` after they
   * finished, keeping `keep`; it replaces the tenant's configured rule.
   */
  setTenantRetention(tenant: string, rule: SetRetention): Promise<RetentionRule> {
    return this.json(`/v1/admin/retention/tenants/${seg(tenant)}`, { method: "PUT", json: rule });
  }

  /** Drop a tenant's stored retention; its configured rule applies again. */
  async deleteTenantRetention(tenant: string): Promise<void> {
    const r = await this.send(`/v1/admin/retention/tenants/${seg(tenant)}`, { method: "DELETE" });
    await r.body?.cancel();
  }

  /** Store a queue's retention (an admin key); a tenant's rule still wins. */
  setQueueRetention(queue: string, rule: SetRetention): Promise<RetentionRule> {
    return this.json(`/v1/admin/retention/queues/${seg(queue)}`, { method: "PUT", json: rule });
  }

  /** Drop a queue's stored retention; its configured rule applies again. */
  async deleteQueueRetention(queue: string): Promise<void> {
    const r = await this.send(`/v1/admin/retention/queues/${seg(queue)}`, { method: "DELETE" });
    await r.body?.cancel();
  }

  cancelSession(id: string): Promise<CancelResult> {
    return this.json(`/v1/sessions/${seg(id)}/cancel`, { method: "POST" });
  }

  cancelSessions(batchId: string, opts: { cursor?: string; limit?: number } = {})
    : Promise<BulkCancelResult> {
    return this.json("/v1/sessions/cancel", {
      method: "POST", json: { batch_id: batchId, ...opts },
    });
  }

  retrySession(id: string): Promise<RetryResult> {
    return this.json(`/v1/sessions/${seg(id)}/retry`, { method: "POST" });
  }

  /**
   * A new session whose history is this one's first `atIteration` iterations (shared,
   * not re-run), then `message`; `model`, `tools` and `token_budget` override the
   * original's spec (held to the tenant's policy). The original never changes.
   */
  forkSession(id: string, atIteration: number,
    opts: Omit<ForkRequest, "at_iteration"> = {}): Promise<ForkResult> {
    return this.json(`/v1/sessions/${seg(id)}/fork`, {
      method: "POST", json: { at_iteration: atIteration, ...opts },
    });
  }

  /** `status` is taken by servers that have it. */
  retrySessions(filter: SessionFilter & { status?: SessionStatus } = {})
    : Promise<BulkRetryResult> {
    return this.json("/v1/sessions/retry", { method: "POST", json: filter });
  }

  async messages(id: string): Promise<Message[]> {
    return (await this.json<S["MessagesResponse"]>(`/v1/sessions/${seg(id)}/messages`)).messages;
  }

  postMessage(id: string, content: string, strategy?: S["Strategy"]): Promise<PostMessageResult> {
    return this.json(`/v1/sessions/${seg(id)}/messages`, {
      method: "POST", json: strategy ? { content, strategy } : { content },
    });
  }

  /** Approve a held call; `args` (servers that take them) replace the model's. */
  approve(id: string, toolCallId: string, args?: Record<string, unknown>)
    : Promise<ApprovalResult> {
    const body: Record<string, unknown> = { tool_call_id: toolCallId, approve: true };
    if (args !== undefined) body.arguments = args;
    return this.json(`/v1/sessions/${seg(id)}/approvals`, { method: "POST", json: body });
  }

  deny(id: string, toolCallId: string, reason?: string): Promise<ApprovalResult> {
    const body: Record<string, unknown> = { tool_call_id: toolCallId, approve: false };
    if (reason !== undefined) body.reason = reason;
    return this.json(`/v1/sessions/${seg(id)}/approvals`, { method: "POST", json: body });
  }

  listApprovals(q: { queue?: string; batch_id?: string; tool?: string; session_id?: string;
    limit?: number; cursor?: string } = {}): Promise<ApprovalPage> {
    return this.json("/v1/approvals", { query: q });
  }

  /** The session once it has finished: followed through its events, or polled every
   * `pollMs` when given. */
  async wait(id: string, opts: { timeoutMs?: number; pollMs?: number } = {})
    : Promise<SessionDetail> {
    const deadline = opts.timeoutMs === undefined ? undefined : Date.now() + opts.timeoutMs;
    let poll = opts.pollMs;
    if (poll === undefined) {
      for await (const _ of this.events(id, { timeoutMs: opts.timeoutMs })) {
        // followed to its end
      }
      poll = 200;
    }
    for (;;) {
      const s = await this.getSession(id);
      if (TERMINAL.has(s.status)) return s;
      if (deadline !== undefined && Date.now() >= deadline) {
        throw new WaitTimeout(`timed out waiting for session ${id}`);
      }
      await sleep(poll / 1000);
    }
  }

  // Files

  async listFiles(id: string): Promise<FileEntry[]> {
    return (await this.json<S["FileList"]>(`/v1/sessions/${seg(id)}/files`)).files;
  }

  async downloadFile(id: string, path: string): Promise<Uint8Array> {
    const p = path.split("/").map(seg).join("/");
    const r = await this.send(`/v1/sessions/${seg(id)}/files/${p}`, { headers: { accept: "*/*" } });
    return new Uint8Array(await r.arrayBuffer());
  }

  async downloadTar(id: string): Promise<Uint8Array> {
    const r = await this.send(`/v1/sessions/${seg(id)}/files`, {
      query: { format: "tar" }, headers: { accept: "application/x-tar" },
    });
    return new Uint8Array(await r.arrayBuffer());
  }

  // Events

  /** The session's events until `session_completed`, resumed from the last event's id
   * after a dropped connection: nothing lost, nothing repeated. */
  async *events(id: string, opts: { lastEventId?: string; timeoutMs?: number } = {})
    : AsyncGenerator<AgentqEvent> {
    let last = opts.lastEventId ?? null;
    const deadline = opts.timeoutMs === undefined ? undefined : Date.now() + opts.timeoutMs;
    let failures = 0;
    for (;;) {
      if (deadline !== undefined && Date.now() >= deadline) {
        throw new WaitTimeout(`timed out following the events of ${id}`);
      }
      const ctl = new AbortController();
      const timer = deadline === undefined ? undefined
        : setTimeout(() => ctl.abort(), Math.max(0, deadline - Date.now()));
      let cause: unknown;
      try {
        const headers = this.headers({ accept: "text/event-stream", "cache-control": "no-cache" });
        if (last) headers["last-event-id"] = last;
        const resp = await this.sendStream(`/v1/sessions/${seg(id)}/events`, headers, ctl.signal);
        const decoder = new SseDecoder();
        const text = new TextDecoder();
        const reader = resp.body!.getReader();
        try {
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            for (const ev of decoder.push(text.decode(value, { stream: true }))) {
              if (ev.id) last = ev.id;
              failures = 0;
              yield ev;
              if (ev.event === "session_completed") return;
            }
          }
        } finally {
          reader.cancel().catch(() => {});
        }
      } catch (e) {
        if (e instanceof ApiError) throw e;
        if (ctl.signal.aborted) throw new WaitTimeout(`timed out following the events of ${id}`);
        cause = e;
      } finally {
        if (timer) clearTimeout(timer);
      }
      failures++;
      if (failures > this.maxReconnects) {
        throw new StreamError(`event stream dropped ${failures} times in a row without an event`,
          { cause });
      }
      if (failures > 1) await sleep(backoff(failures - 1));
    }
  }

  private async sendStream(path: string, headers: Record<string, string>, signal: AbortSignal)
    : Promise<Response> {
    for (let attempt = 1; ; attempt++) {
      const resp = await this.fetch(this.url + path, { headers, signal });
      if (resp.ok) return resp;
      const delay = retryDelay(resp.status, resp.headers, attempt, this.maxRetries);
      if (delay === null) throw await ApiError.from(resp);
      await resp.body?.cancel();
      await sleep(delay);
    }
  }

  // Batches

  /** A batch from a list of session requests (each with an optional `custom_id`). */
  submitBatch(requests: BatchRequestItem[], opts: { maxRunning?: number;
    metadata?: Record<string, unknown> } = {}): Promise<Batch> {
    const body: Record<string, unknown> = { requests };
    if (opts.maxRunning !== undefined) body.max_running = opts.maxRunning;
    if (opts.metadata !== undefined) body.metadata = opts.metadata;
    return this.json("/v1/batches", { method: "POST", json: body });
  }

  /** A batch as JSON Lines, streamed: from a stream of bytes (e.g. a file's
   * `Readable.toWeb(fs.createReadStream(path))`) or an iterable of requests. */
  uploadBatch(source: ReadableStream<Uint8Array> | Iterable<BatchRequestItem>
    | AsyncIterable<BatchRequestItem>, opts: { maxRunning?: number;
    metadata?: Record<string, unknown> } = {}): Promise<Batch> {
    const body = source instanceof ReadableStream ? source : jsonLines(source);
    return this.json("/v1/batches", {
      method: "POST", body,
      headers: { "content-type": "application/x-ndjson" },
      query: {
        max_running: opts.maxRunning,
        metadata: opts.metadata === undefined ? undefined : JSON.stringify(opts.metadata),
      },
    });
  }

  getBatch(id: string): Promise<Batch> {
    return this.json(`/v1/batches/${seg(id)}`);
  }

  listBatches(opts: { limit?: number; cursor?: string } = {}): Promise<BatchPage> {
    return this.json("/v1/batches", { query: opts });
  }

  async *iterBatches(opts: { limit?: number } = {}): AsyncGenerator<Batch> {
    let cursor: string | undefined;
    for (;;) {
      const page = await this.listBatches({ ...opts, cursor });
      yield* page.batches;
      if (!page.next_cursor) return;
      cursor = page.next_cursor;
    }
  }

  cancelBatch(id: string): Promise<Batch> {
    return this.json(`/v1/batches/${seg(id)}/cancel`, { method: "POST" });
  }

  /** The results in request order across pages; with `wait` (the default) until the
   * last session finished, else what is ready. */
  async *batchResults(id: string, opts: { wait?: boolean; pollMs?: number; limit?: number;
    after?: string; timeoutMs?: number } = {}): AsyncGenerator<BatchResult> {
    const wait = opts.wait ?? true;
    const deadline = opts.timeoutMs === undefined ? undefined : Date.now() + opts.timeoutMs;
    let after = opts.after;
    for (;;) {
      const r = await this.send(`/v1/batches/${seg(id)}/results`, {
        query: { after, limit: opts.limit }, headers: { accept: "application/x-ndjson" },
      });
      const state = r.headers.get("agentq-results") ?? "complete";
      const next = r.headers.get("agentq-next");
      for (const line of (await r.text()).split("\n")) {
        if (!line.trim()) continue;
        const res = JSON.parse(line) as BatchResult;
        after = res.id;
        yield res;
      }
      if (next) after = next;
      if (state === "complete" || (state === "waiting" && !wait)) return;
      if (state === "waiting") {
        if (deadline !== undefined && Date.now() >= deadline) {
          throw new WaitTimeout(`timed out waiting for the results of batch ${id}`);
        }
        await sleep((opts.pollMs ?? 500) / 1000);
      }
    }
  }

  // Webhooks (verify a delivery with `verifyWebhook`)

  /** Register an endpoint; the answer's `secret` (`whsec_…`) is shown only here. */
  createWebhook(url: string, events: string[],
    opts: Omit<CreateWebhook, "url" | "events"> = {}): Promise<Webhook> {
    return this.json("/v1/webhooks", { method: "POST", json: { ...opts, url, events } });
  }

  async listWebhooks(): Promise<Webhook[]> {
    return (await this.json<S["WebhookList"]>("/v1/webhooks")).webhooks;
  }

  getWebhook(id: string): Promise<Webhook> {
    return this.json(`/v1/webhooks/${seg(id)}`);
  }

  /** The endpoint and its deliveries, sent or not. */
  async deleteWebhook(id: string): Promise<void> {
    const r = await this.send(`/v1/webhooks/${seg(id)}`, { method: "DELETE" });
    await r.body?.cancel();
  }

  /** A new `secret` (in this answer only); the old one signs too for `overlapSecs` (a day
   * when absent). */
  rotateWebhookSecret(id: string, opts: { overlapSecs?: number } = {}): Promise<Webhook> {
    const body = opts.overlapSecs === undefined ? {} : { overlap_secs: opts.overlapSecs };
    return this.json(`/v1/webhooks/${seg(id)}/rotate`, { method: "POST", json: body });
  }

  /** Send again to an endpoint disabled after failing for too long. */
  enableWebhook(id: string): Promise<Webhook> {
    return this.json(`/v1/webhooks/${seg(id)}/enable`, { method: "POST", json: {} });
  }

  /** One page of the endpoint's deliveries, newest first; `state: "dead"` gives its dead
   * letters. */
  listDeliveries(id: string, q: { state?: Delivery["state"]; limit?: number;
    cursor?: string } = {}): Promise<DeliveryPage> {
    return this.json(`/v1/webhooks/${seg(id)}/deliveries`, { query: q });
  }

  async *iterDeliveries(id: string, q: { state?: Delivery["state"]; limit?: number } = {})
    : AsyncGenerator<Delivery> {
    let cursor: string | undefined;
    for (;;) {
      const page = await this.listDeliveries(id, { ...q, cursor });
      yield* page.deliveries;
      if (!page.next_cursor) return;
      cursor = page.next_cursor;
    }
  }

  /** Queue the endpoint's dead letters again (it must be enabled). */
  redriveWebhook(id: string): Promise<Redriven> {
    return this.json(`/v1/webhooks/${seg(id)}/redrive`, { method: "POST", json: {} });
  }

  // Schedules

  /** A session from `session` (what `createSession` sends) at each time of `cron` in
   * `timezone`, or every `every_secs` seconds; `overlap` is `skip`, `buffer_one`,
   * `cancel_other` or `allow_all`. */
  createSchedule(session: CreateSchedule["session"],
    opts: Omit<CreateSchedule, "session"> = {}): Promise<Schedule> {
    return this.json("/v1/schedules", { method: "POST", json: { ...opts, session } });
  }

  listSchedules(q: { limit?: number; cursor?: string } = {}): Promise<SchedulePage> {
    return this.json("/v1/schedules", { query: q });
  }

  getSchedule(id: string): Promise<Schedule> {
    return this.json(`/v1/schedules/${seg(id)}`);
  }

  /** The schedule and its history (its sessions stay). */
  async deleteSchedule(id: string): Promise<void> {
    const r = await this.send(`/v1/schedules/${seg(id)}`, { method: "DELETE" });
    await r.body?.cancel();
  }

  pauseSchedule(id: string): Promise<Schedule> {
    return this.json(`/v1/schedules/${seg(id)}/pause`, { method: "POST", json: {} });
  }

  /** Fire again from the next time after now. */
  resumeSchedule(id: string): Promise<Schedule> {
    return this.json(`/v1/schedules/${seg(id)}/resume`, { method: "POST", json: {} });
  }

  /** One fire now, under the schedule's overlap policy. */
  triggerSchedule(id: string): Promise<Fire> {
    return this.json(`/v1/schedules/${seg(id)}/trigger`, { method: "POST", json: {} });
  }

  /** One page of the schedule's fires, newest first. */
  listScheduleFires(id: string, q: { limit?: number; cursor?: string } = {})
    : Promise<FirePage> {
    return this.json(`/v1/schedules/${seg(id)}/fires`, { query: q });
  }

  async waitBatch(id: string, opts: { timeoutMs?: number; pollMs?: number } = {})
    : Promise<Batch> {
    const deadline = opts.timeoutMs === undefined ? undefined : Date.now() + opts.timeoutMs;
    for (;;) {
      const b = await this.getBatch(id);
      if (b.status === "completed" || b.status === "cancelled") return b;
      if (deadline !== undefined && Date.now() >= deadline) {
        throw new WaitTimeout(`timed out waiting for batch ${id}`);
      }
      await sleep((opts.pollMs ?? 500) / 1000);
    }
  }
}

function jsonLines(items: Iterable<BatchRequestItem> | AsyncIterable<BatchRequestItem>)
  : ReadableStream<Uint8Array> {
  const enc = new TextEncoder();
  const it = (Symbol.asyncIterator in items
    ? (items as AsyncIterable<BatchRequestItem>)[Symbol.asyncIterator]()
    : (items as Iterable<BatchRequestItem>)[Symbol.iterator]()) as
    AsyncIterator<BatchRequestItem> | Iterator<BatchRequestItem>;
  return new ReadableStream<Uint8Array>({
    async pull(ctl) {
      const { value, done } = await it.next();
      if (done) ctl.close();
      else ctl.enqueue(enc.encode(JSON.stringify(value) + "\n"));
    },
  });
}
