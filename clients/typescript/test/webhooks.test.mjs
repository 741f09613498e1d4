import assert from "node:assert/strict";
import { createServer } from "node:http";
import { test } from "node:test";

import {
  AgentqClient, WebhookVerificationError, signWebhook, verifyWebhook,
} from "../dist/index.js";
import { collect, serverOnly } from "./helpers.mjs";

const SECRET = "whsec_" + Buffer.from("a receiver's own test secret, 32B").toString("base64");

/** A local HTTP server answering 204 to every POST; `next(match)` resolves with the first
 * delivery (headers, raw body) whose parsed body `match` holds for, as it arrives. */
async function receiver() {
  const got = [];
  const waiting = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const d = { headers: req.headers, body: Buffer.concat(chunks) };
      got.push(d);
      for (const w of [...waiting]) {
        if (w.match(JSON.parse(d.body))) {
          waiting.splice(waiting.indexOf(w), 1);
          w.resolve(d);
        }
      }
      res.writeHead(204).end();
    });
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}/hook`,
    next(match) {
      const seen = got.find((d) => match(JSON.parse(d.body)));
      if (seen) return Promise.resolve(seen);
      return new Promise((resolve) => waiting.push({ match, resolve }));
    },
    close: () => new Promise((r) => server.close(r)),
  };
}

test("a delivery verifies with verifyWebhook and attacks are refused", serverOnly, async () => {
  const aq = new AgentqClient();
  const rx = await receiver();
  const hook = await aq.createWebhook(rx.url, ["session.completed"], { description: "ts" });
  try {
    assert.ok(hook.secret?.startsWith("whsec_"));
    assert.equal((await aq.getWebhook(hook.id)).secret, undefined);
    assert.ok((await aq.listWebhooks()).some((w) => w.id === hook.id));

    const ref = await aq.createSession("webhook me");
    assert.equal((await aq.wait(ref.id, { timeoutMs: 120_000 })).status, "completed");
    const { headers, body } = await rx.next(
      (b) => b.type === "session.completed" && b.data.session_id === ref.id);
    const payload = verifyWebhook(hook.secret, headers, body);
    assert.equal(payload.type, "session.completed");
    assert.equal(payload.data.status, "completed");
    assert.equal(payload.data.finish_reason, "stop");
    // A Headers object and a string body verify the same.
    verifyWebhook(hook.secret, new Headers(headers), body.toString("utf8"));

    const then = Math.trunc(Date.now() / 1000) - 3600;
    const old = { ...headers, "webhook-timestamp": String(then),
      "webhook-signature": signWebhook(hook.secret, headers["webhook-id"], then, body) };
    const without = (name) => Object.fromEntries(
      Object.entries(headers).filter(([k]) => k !== name));
    const attacks = {
      "a tampered body": [hook.secret, headers, Buffer.from(
        body.toString("utf8").replace('"completed"', '"cancelled"'))],
      "the wrong secret": [SECRET, headers, body],
      "an old timestamp": [hook.secret, old, body],
      "no signature": [hook.secret, without("webhook-signature"), body],
      "no timestamp": [hook.secret, without("webhook-timestamp"), body],
    };
    for (const [name, [secret, h, b]] of Object.entries(attacks)) {
      assert.throws(() => verifyWebhook(secret, h, b), WebhookVerificationError, name);
    }
    // The tolerance is the receiver's to choose.
    verifyWebhook(hook.secret, old, body, { tolerance: 7200 });

    const deliveries = await collect(aq.iterDeliveries(hook.id, { limit: 1 }));
    assert.ok(deliveries.some((d) => d.session_id === ref.id));
    assert.deepEqual((await aq.listDeliveries(hook.id, { state: "dead" })).deliveries, []);
    assert.equal((await aq.redriveWebhook(hook.id)).requeued, 0);
    const rotated = await aq.rotateWebhookSecret(hook.id, { overlapSecs: 60 });
    assert.ok(rotated.secret && rotated.secret !== hook.secret);
    assert.ok(rotated.previous_secret_expires_at);
    assert.equal((await aq.enableWebhook(hook.id)).status, "enabled");
  } finally {
    await aq.deleteWebhook(hook.id);
    await rx.close();
  }
  assert.ok(!(await aq.listWebhooks()).some((w) => w.id === hook.id));
});

test("during a rotation either secret verifies", () => {
  const other = "whsec_" + Buffer.from("another secret of thirty-two b.").toString("base64");
  const body = '{"type":"batch.completed","timestamp":"2026-12-01T00:00:00Z","data":{"batch_id":"b"}}';
  const now = Math.trunc(Date.now() / 1000);
  const headers = { "webhook-id": "msg_1", "webhook-timestamp": String(now),
    "webhook-signature": `${signWebhook(SECRET, "msg_1", now, body)} ${signWebhook(other, "msg_1", now, body)}` };
  for (const s of [SECRET, other]) {
    assert.deepEqual(verifyWebhook(s, headers, body).data, { batch_id: "b" });
  }
  const stranger = "whsec_" + Buffer.alloc(32, 7).toString("base64");
  assert.throws(() => verifyWebhook(stranger, headers, body), WebhookVerificationError);
  assert.throws(() => verifyWebhook(SECRET, { ...headers, "webhook-timestamp": "soon" }, body),
    WebhookVerificationError);
  assert.throws(() => verifyWebhook(SECRET,
    { ...headers, "webhook-timestamp": String(now + 3600) }, body), WebhookVerificationError);
  // The specification's own example (standard-webhooks' test vector).
  const vector = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
  const vbody = '{"test": 2432232314}';
  assert.equal(signWebhook(vector, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, vbody),
    "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
});
