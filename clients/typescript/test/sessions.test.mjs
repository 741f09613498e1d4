import assert from "node:assert/strict";
import { test } from "node:test";

import { AgentqClient, ApiError } from "../dist/index.js";
import { FAIL_ONCE, HOLD, collect, document, held, serverOnly } from "./helpers.mjs";

const dec = (b) => new TextDecoder().decode(b);

test("a session with files runs, and everything about it reads back", serverOnly, async () => {
  const aq = new AgentqClient();
  const bin = new Uint8Array([0, 1, 254, 255]);
  const ref = await aq.createSession("summarise", {
    files: { "input.txt": "hello there", "data/blob.bin": bin }, metadata: { team: "ts" },
    tools: ["read_file", "write_file"],
  });
  assert.equal(ref.status, "queued");
  const done = await aq.wait(ref.id, { timeoutMs: 120_000 });
  assert.equal(done.status, "completed");
  assert.equal(done.result, "Done: summarise");
  const files = Object.fromEntries((await aq.listFiles(ref.id)).map((f) => [f.path, f]));
  assert.ok(files["out/result.txt"] && files["input.txt"]);
  assert.deepEqual(await aq.downloadFile(ref.id, "data/blob.bin"), bin);
  assert.equal(dec(await aq.downloadFile(ref.id, "out/result.txt")), "written by the script");
  const tar = await aq.downloadTar(ref.id);
  assert.equal(dec(tar.slice(257, 262)), "ustar");
  const msgs = await aq.messages(ref.id);
  assert.equal(msgs[0].role, "user");
  assert.deepEqual((await aq.getSession(ref.id)).metadata, { team: "ts" });
  const ids = (await collect(aq.iterSessions({ status: "completed", limit: 1 }))).map((s) => s.id);
  assert.ok(ids.includes(ref.id));
  assert.equal(new Set(ids).size, ids.length);
});

test("a bad request raises with its field", serverOnly, async () => {
  const aq = new AgentqClient();
  await assert.rejects(aq.createSession("typo", { max_iteration: 3 }), (e) =>
    e instanceof ApiError && e.status === 422 && e.code === "unknown_field"
    && e.field === "max_iteration" && e.body.error.field === "max_iteration");
  await assert.rejects(aq.getSession("00000000-0000-0000-0000-000000000000"),
    (e) => e instanceof ApiError && e.status === 404 && e.code === "not_found");
});

test("held calls are approved, denied and cancelled", serverOnly, async () => {
  const aq = new AgentqClient();
  const spec = await document();
  const [id1, call1, view] = await held(aq, `${HOLD} ts one`);
  assert.deepEqual(view.pending_approvals.map((p) => p.tool_call_id), [call1]);
  if (spec.paths["/v1/approvals"]?.get) {
    const page = await aq.listApprovals({ session_id: id1 });
    assert.deepEqual(page.approvals.map((a) => [a.session_id, a.tool_call_id]), [[id1, call1]]);
  }
  assert.equal((await aq.approve(id1, call1)).approve, true);
  assert.equal((await aq.wait(id1, { timeoutMs: 120_000 })).status, "completed");
  assert.equal(dec(await aq.downloadFile(id1, "approved.txt")), "approved");

  const [id2, call2] = await held(aq, `${HOLD} ts two`);
  await aq.deny(id2, call2, "not today");
  assert.equal((await aq.wait(id2, { timeoutMs: 120_000, pollMs: 100 })).status, "completed");

  const [id3] = await held(aq, `${HOLD} ts three`);
  assert.equal((await aq.cancelSession(id3)).status, "cancelled");
  await assert.rejects(aq.cancelSession(id3),
    (e) => e instanceof ApiError && e.status === 409 && e.code === "already_finished");
});

test("a failed session is retried", serverOnly, async () => {
  const aq = new AgentqClient();
  const ref = await aq.createSession(`${FAIL_ONCE} ts`);
  const failed = await aq.wait(ref.id, { timeoutMs: 120_000 });
  assert.equal(failed.status, "failed");
  assert.equal((await aq.retrySession(ref.id)).status, "queued");
  assert.equal((await aq.wait(ref.id, { timeoutMs: 120_000 })).status, "completed");
});

test("counts, costs and operations", serverOnly, async () => {
  const spec = await document();
  if (!spec.paths["/v1/sessions/counts"]?.get) return;
  const aq = new AgentqClient();
  const word = `tscount${Date.now()}${Math.floor(Math.random() * 1e6)}`;
  const ref = await aq.createSession(`count ${word} please`);
  await aq.wait(ref.id, { timeoutMs: 120_000 });
  const counts = await aq.countSessions({ q: word });
  const page = await aq.listSessions({ q: word });
  assert.deepEqual(page.sessions.map((s) => s.id), [ref.id]);
  assert.equal(counts.total, 1);
  assert.deepEqual(counts.by_status, { completed: 1 });
  assert.equal((await aq.countSessions({ q: `${word}_` })).total, 0);
  await assert.rejects(aq.countSessions({ q: "x".repeat(201) }),
    (e) => e instanceof ApiError && e.field === "q");
  const costs = await aq.costs();
  assert.ok(costs.rows.some((r) => r.sessions >= 1));
  await assert.rejects(aq.costs({ since: "2020-01-01T00:00:00Z", until: "2022-01-01T00:00:00Z" }),
    (e) => e instanceof ApiError && e.field === "since");
  const ops = await aq.operations();
  assert.deepEqual(Object.keys(ops.waiting).sort(), ["approval", "budget", "children", "rate_limit"]);
  const def = ops.queues.find((q) => q.name === "default");
  assert.ok(def && def.length !== null && def.length !== undefined && def.held >= 0);
});

test("a session is forked from a step", serverOnly, async () => {
  const spec = await document();
  if (!spec.paths["/v1/sessions/{id}/fork"]?.post) return;
  const aq = new AgentqClient();
  const ref = await aq.createSession("ts fork", {
    files: { "input.txt": "to fork" }, tools: ["read_file", "write_file"],
  });
  assert.equal((await aq.wait(ref.id, { timeoutMs: 120_000 })).status, "completed");
  const origin = await aq.messages(ref.id);
  const fork = await aq.forkSession(ref.id, 1, { message: "once more" });
  assert.equal(fork.forked_from, ref.id);
  assert.equal(fork.at_iteration, 1);
  const msgs = await aq.messages(fork.id);
  assert.deepEqual(msgs.slice(0, 3), origin.slice(0, 3));
  assert.equal(msgs[3].content, "once more");
  assert.equal((await aq.getSession(fork.id)).forked_from, ref.id);
  await aq.wait(fork.id, { timeoutMs: 120_000 });
  assert.deepEqual(await aq.messages(ref.id), origin);
  await assert.rejects(aq.forkSession(ref.id, 99), (e) =>
    e instanceof ApiError && e.status === 422 && e.field === "at_iteration");
});
