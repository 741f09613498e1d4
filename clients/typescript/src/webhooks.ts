// Verifying a delivery, as the Standard Webhooks specification (v1) says: the signed
// content is `{webhook-id}.{webhook-timestamp}.{body}`, HMAC-SHA256 keyed with the
// endpoint's secret (the base64 after `whsec_`); `webhook-signature` holds one
// `v1,<base64>` per secret in force, separated by spaces (two during a rotation's
// overlap), and any one matching is enough. A timestamp further than the tolerance from
// now is refused, so that a captured delivery cannot be replayed later.

import { createHmac, timingSafeEqual } from "node:crypto";

import type { components } from "./schema.js";

/** The body of a delivery: `type` the event, `data` its fields (one shape per event, as
 * the document's `webhooks` describe them). */
export type WebhookPayload = components["schemas"]["WebhookPayload"];

export const SECRET_PREFIX = "whsec_";
/** The specification's suggestion: five minutes either way, in seconds. */
export const DEFAULT_TOLERANCE = 300;

/** The delivery is not proven to come from the server: refuse it (answer 4xx). */
export class WebhookVerificationError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookVerificationError";
  }
}

export type WebhookHeaders = Headers | Record<string, string | string[] | undefined>;

function key(secret: string | Uint8Array): Buffer {
  if (typeof secret !== "string") return Buffer.from(secret);
  const text = secret.startsWith(SECRET_PREFIX) ? secret.slice(SECRET_PREFIX.length) : secret;
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text)) {
    throw new WebhookVerificationError("the secret is not base64 after `whsec_`");
  }
  const k = Buffer.from(text, "base64");
  if (k.length === 0) throw new WebhookVerificationError("the secret is empty");
  return k;
}

function header(headers: WebhookHeaders, name: string): string | undefined {
  if (headers instanceof Headers) return headers.get(name) ?? undefined;
  for (const [k, v] of Object.entries(headers)) {
    if (k.toLowerCase() === name) return Array.isArray(v) ? v.join(" ") : v;
  }
  return undefined;
}

function bytes(body: string | Uint8Array): Buffer {
  return typeof body === "string" ? Buffer.from(body, "utf8") : Buffer.from(body);
}

/** The `v1,…` signature of one delivery under `secret`. */
export function signWebhook(secret: string | Uint8Array, id: string, timestamp: number,
  body: string | Uint8Array): string {
  const mac = createHmac("sha256", key(secret));
  mac.update(`${id}.${timestamp}.`);
  mac.update(bytes(body));
  return `v1,${mac.digest("base64")}`;
}

/** The delivery's payload once `headers` prove `body` (its bytes exactly as received)
 * was signed with `secret` within `tolerance` seconds of `now` (seconds since the epoch,
 * the clock's when absent); else a `WebhookVerificationError` saying why. */
export function verifyWebhook(secret: string | Uint8Array, headers: WebhookHeaders,
  body: string | Uint8Array,
  opts: { tolerance?: number; now?: number } = {}): WebhookPayload {
  const id = header(headers, "webhook-id");
  const ts = header(headers, "webhook-timestamp");
  const sigs = header(headers, "webhook-signature");
  const missing = [["webhook-id", id], ["webhook-timestamp", ts], ["webhook-signature", sigs]]
    .filter(([, v]) => !v).map(([n]) => n);
  if (missing.length > 0) {
    throw new WebhookVerificationError(`missing header ${missing.join(", ")}`);
  }
  if (!/^\d+$/.test(ts!)) {
    throw new WebhookVerificationError("webhook-timestamp is not a whole number of seconds");
  }
  const timestamp = Number(ts);
  const now = opts.now ?? Date.now() / 1000;
  const tolerance = opts.tolerance ?? DEFAULT_TOLERANCE;
  if (Math.abs(now - timestamp) > tolerance) {
    throw new WebhookVerificationError(
      `webhook-timestamp is ${Math.trunc(now - timestamp)} s from now, over the tolerance of ${tolerance} s`);
  }
  const raw = bytes(body);
  const expected = Buffer.from(signWebhook(secret, id!, timestamp, raw));
  // Each candidate compared in constant time (lengths differ only for another version).
  const matches = sigs!.split(" ").some((s) => {
    const given = Buffer.from(s);
    return given.length === expected.length && timingSafeEqual(given, expected);
  });
  if (!matches) {
    throw new WebhookVerificationError("no signature in webhook-signature matches the secret");
  }
  try {
    return JSON.parse(raw.toString("utf8")) as WebhookPayload;
  } catch (e) {
    throw new WebhookVerificationError(`the signed body is not JSON: ${e}`);
  }
}
