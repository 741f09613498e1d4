// What the tests share: the server and the fault proxy the Rust test started
// (AGENTQ_URL, AGENTQ_API_KEY, AGENTQ_FAULT_URL; without them the server tests are
// skipped), and the markers of the server's script (cli/tests/it/clients.rs writes it).

export const URL_SET = Boolean(process.env.AGENTQ_URL);
export const FAULT_URL = process.env.AGENTQ_FAULT_URL;
export const HOLD = "HOLD-FOR-APPROVAL";
export const FAIL_ONCE = "FAIL-ONCE";
export const SLOW = "STREAM-SLOWLY";
export const serverOnly = { skip: URL_SET ? false : "AGENTQ_URL names no server" };
export const proxyOnly = { skip: URL_SET && FAULT_URL ? false : "no fault proxy" };

export async function resetProxy() {
  await fetch(`${FAULT_URL}/__reset`, { method: "POST" });
}

export async function proxyStats() {
  return (await fetch(`${FAULT_URL}/__stats`)).json();
}

export async function collect(iter) {
  const out = [];
  for await (const x of iter) out.push(x);
  return out;
}

let spec;
export async function document() {
  spec ??= await (await fetch(`${process.env.AGENTQ_URL}/openapi.json`)).json();
  return spec;
}

/** A session holding a write for approval, once it waits for the decision: its id, the
 * held call's id and its view. Polled, not followed through the events: a stream opened
 * while the worker's events are not yet in Redis is rebuilt from the transcript, which
 * holds no `approval_requested` (a server matter, not the client's). */
export async function held(client, prompt) {
  const ref = await client.createSession(prompt, {
    tools: ["write_file"], sensitive_tools: ["write_file"],
  });
  const deadline = Date.now() + 120_000;
  let s = await client.getSession(ref.id);
  while (s.status !== "awaiting_approval") {
    if (Date.now() > deadline) throw new Error(`still ${s.status}`);
    await new Promise((r) => setTimeout(r, 50));
    s = await client.getSession(ref.id);
  }
  return [ref.id, s.pending_approvals[0].tool_call_id, s];
}
