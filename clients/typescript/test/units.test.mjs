import assert from "node:assert/strict";
import { test } from "node:test";

import { ApiError, SseDecoder, encodeFiles, retryDelay } from "../dist/index.js";

test("events are decoded across chunk boundaries and a cut event is dropped", () => {
  const d = new SseDecoder();
  const text = ": keep-alive\r\n\r\nid: 1-0\r\nevent: text_delta\r\ndata: {\"text\":\"a\",\"seq\":2}\r\n\r\n"
    + "event: reset\ndata: {\"seq\":2}\n\nid: 1-1\ndata: one\ndata: two\n\nid: 1-2\nevent: text_delta\ndata: {";
  const out = [];
  // One character at a time: a `\r\n` split between two chunks is one line end.
  for (const ch of text) out.push(...d.push(ch));
  assert.deepEqual(out.map((e) => [e.id, e.event]), [["1-0", "text_delta"], [null, "reset"],
    ["1-1", "message"]]);
  assert.equal(out[0].data.seq, 2);
  assert.equal(out[2].data, "one\ntwo");
});

test("retry delays honour Retry-After and stop", () => {
  const h = (v) => new Headers(v === undefined ? {} : { "retry-after": v });
  assert.equal(retryDelay(429, h("3"), 1, 5), 3);
  assert.equal(retryDelay(503, h("0"), 5, 5), 0);
  assert.equal(retryDelay(503, h("1"), 6, 5), null);
  assert.equal(retryDelay(429, h("3600"), 1, 5), null);
  assert.equal(retryDelay(400, h("1"), 1, 5), null);
  const d = retryDelay(429, h(), 1, 5);
  assert.ok(d > 0 && d <= 0.25);
});

test("files are text or base64", () => {
  assert.deepEqual(encodeFiles({ "a.txt": "hi", "b.bin": new Uint8Array([0, 255]),
    "c.txt": new TextEncoder().encode("text") }),
  { "a.txt": "hi", "b.bin": { base64: "AP8=" }, "c.txt": "text" });
});

test("errors carry the body", async () => {
  const e = await ApiError.from(new Response(
    JSON.stringify({ error: { code: "unknown_field", message: "no", field: "x" } }),
    { status: 422 }));
  assert.deepEqual([e.status, e.code, e.field], [422, "unknown_field", "x"]);
});
