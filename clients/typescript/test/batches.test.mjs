import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { createReadStream, mkdirSync, mkdtempSync, readFileSync, symlinkSync, writeFileSync }
  from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { Readable } from "node:stream";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { AgentqClient, ApiError } from "../dist/index.js";
import { HOLD, collect, serverOnly } from "./helpers.mjs";

const here = dirname(fileURLToPath(import.meta.url));

test("a batch from a list runs and reads back in order across pages", serverOnly, async () => {
  const aq = new AgentqClient();
  const items = [0, 1, 2, 3, 4].map((i) => ({ custom_id: `item-${i}`, prompt: `task ${i}` }));
  const batch = await aq.submitBatch(items, { maxRunning: 2, metadata: { run: "ts-list" } });
  assert.equal(batch.total, 5);
  assert.deepEqual(batch.metadata, { run: "ts-list" });
  const results = await collect(aq.batchResults(batch.id, { limit: 2, timeoutMs: 120_000 }));
  assert.deepEqual(results.map((r) => r.custom_id), items.map((i) => i.custom_id));
  assert.deepEqual(results.map((r) => r.result), items.map((i) => `Done: ${i.prompt}`));
  const done = await aq.waitBatch(batch.id, { timeoutMs: 120_000 });
  assert.equal(done.counts.completed, 5);
  assert.ok((await collect(aq.iterBatches({ limit: 1 }))).some((b) => b.id === batch.id));
});

test("a batch from a JSON Lines file is streamed", serverOnly, async () => {
  const aq = new AgentqClient();
  const dir = mkdtempSync(join(tmpdir(), "aq-ts-"));
  const path = join(dir, "batch.jsonl");
  writeFileSync(path, [0, 1, 2].map((i) =>
    JSON.stringify({ custom_id: `line-${i}`, prompt: `line ${i}` }) + "\n").join(""));
  const batch = await aq.uploadBatch(Readable.toWeb(createReadStream(path)),
    { maxRunning: 1, metadata: { run: "ts-file" } });
  assert.equal(batch.total, 3);
  assert.equal(batch.max_running, 1);
  const got = (await collect(aq.batchResults(batch.id, { timeoutMs: 120_000 })))
    .map((r) => [r.custom_id, r.result]);
  assert.deepEqual(got, [0, 1, 2].map((i) => [`line-${i}`, `Done: line ${i}`]));
  function* gen() { yield { prompt: "gen 0" }; yield { prompt: "gen 1" }; }
  assert.equal((await aq.uploadBatch(gen())).total, 2);
  await assert.rejects(aq.submitBatch([{ prompt: "ok" }, { prompt: "bad", mode: "sideways" }]),
    (e) => e instanceof ApiError && e.field === "requests[1].mode");
});

test("a batch is cancelled", serverOnly, async () => {
  const aq = new AgentqClient();
  const batch = await aq.submitBatch([0, 1].map((i) =>
    ({ prompt: `${HOLD} ts b${i}`, tools: ["write_file"], sensitive_tools: ["write_file"] })));
  const c = await aq.cancelBatch(batch.id);
  assert.ok(["cancelling", "cancelled"].includes(c.status));
  assert.equal((await aq.waitBatch(batch.id, { timeoutMs: 120_000 })).status, "cancelled");
  const results = await collect(aq.batchResults(batch.id, { timeoutMs: 60_000 }));
  assert.deepEqual(results.map((r) => r.status), ["cancelled", "cancelled"]);
});

test("the README's batch script runs as written", serverOnly, () => {
  const readme = readFileSync(join(here, "..", "README.md"), "utf8");
  const block = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1])
    .find((b) => b.includes("submitBatch"));
  assert.ok(block, "the README shows no batch script");
  assert.ok(block.trim().split("\n").length <= 12);
  // Run where `agentq-client` resolves to this package, as it would once installed.
  const dir = mkdtempSync(join(tmpdir(), "aq-readme-"));
  mkdirSync(join(dir, "node_modules"));
  symlinkSync(join(here, ".."), join(dir, "node_modules", "agentq-client"));
  writeFileSync(join(dir, "batch.mjs"), block);
  const out = spawnSync(process.execPath, ["batch.mjs"], { cwd: dir, encoding: "utf8",
    timeout: 180_000 });
  assert.equal(out.status, 0, out.stderr);
  const lines = out.stdout.trim().split("\n");
  assert.equal(lines.length, 3, out.stdout);
  for (const l of lines) assert.match(l, /^q\d+ completed Done: /);
});
