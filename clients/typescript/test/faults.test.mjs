import assert from "node:assert/strict";
import { test } from "node:test";

import { AgentqClient, ApiError } from "../dist/index.js";
import { FAULT_URL, SLOW, collect, proxyOnly, proxyStats, resetProxy } from "./helpers.mjs";

// Not the ids: a stream opened before the worker's events reach Redis starts from ids
// rebuilt from the transcript (`t-<seq>-<k>`), a later replay has Redis's.
const tuples = (evs) => {
  assert.ok(evs.every((e) => e.id) && new Set(evs.map((e) => e.id)).size === evs.length);
  return evs.map((e) => [e.event, e.data]);
};

test("a cut stream resumes from Last-Event-ID without loss or repeat", proxyOnly, async () => {
  await resetProxy();
  const aq = new AgentqClient();
  const cut = new AgentqClient({ url: `${FAULT_URL}/drop` });
  // Slow enough for the reader to be there before the first event and as the last ones
  // are written: the server's rebuilt events (a stream opened after the run ended and
  // before its events were stored) are not this test's subject.
  const ref = await aq.createSession(`${SLOW} stream me from ts`, { files: { "input.txt": "cut" } });
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
