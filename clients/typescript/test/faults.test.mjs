import assert from "node:assert/strict";
import { test } from "node:test";

import { AgentqClient, ApiError } from "../dist/index.js";
import { FAULT_URL, collect, proxyOnly, proxyStats, resetProxy } from "./helpers.mjs";

const tuples = (evs) => evs.map((e) => [e.id, e.event, e.data]);

test("a cut stream resumes from Last-Event-ID without loss or repeat", proxyOnly, async () => {
  await resetProxy();
  const aq = new AgentqClient();
  const cut = new AgentqClient({ url: `${FAULT_URL}/drop` });
  const ref = await aq.createSession("stream me from ts", { files: { "input.txt": "cut" } });
  const live = await collect(cut.events(ref.id, { timeoutMs: 120_000 }));
  const whole = await collect(aq.events(ref.id));
  assert.deepEqual(tuples(live), tuples(whole));
  assert.equal(whole.at(-1).event, "session_completed");
  assert.equal(new Set(whole.map((e) => e.id)).size, whole.length);
  assert.ok((await proxyStats()).cuts >= 3);
  const rest = await collect(cut.events(ref.id, { lastEventId: whole[2].id }));
  assert.deepEqual(tuples(rest), tuples(whole.slice(3)));
});

test("429 and 503 are retried after Retry-After, never early", proxyOnly, async () => {
  await resetProxy();
  const slow = new AgentqClient({ url: `${FAULT_URL}/throttle` });
  const started = Date.now();
  const ref = await slow.createSession("throttled from ts");
  await slow.getSession(ref.id);
  await slow.listSessions({ limit: 1 });
  const stats = await proxyStats();
  assert.equal(stats.throttled, 3);
  assert.equal(stats.early, 0);
  assert.ok(Date.now() - started >= 3000);
});

test("retries are bounded", proxyOnly, async () => {
  await resetProxy();
  const refused = new AgentqClient({ url: `${FAULT_URL}/always429`, maxRetries: 2 });
  await assert.rejects(refused.listSessions(), (e) =>
    e instanceof ApiError && e.status === 429 && e.code === "rate_limited" && e.retryAfter === 0);
  assert.equal((await proxyStats()).refused, 3);
});
