// A session's event stream read with fetch (an EventSource cannot send a bearer key),
// parsed as server-sent events, and resumed after a drop with Last-Event-ID so that no
// event is lost or shown twice.

import { authHeaders } from "./api.js";

/** Follow `path` until `session_completed`, `signal` aborts, or the server refuses it.
 * `onEvent({event, id, data})` gets each event in order; `onState(text)` hears of drops
 * and reconnects. `cursor.lastId` is where to resume (kept up to date, so a later call
 * with the same cursor continues after the last event seen). Resolves when done. */
export async function follow(path, { onEvent, onState = () => {}, signal, cursor = {} }) {
  let pause = 250;
  while (!signal.aborted) {
    const headers = authHeaders({ Accept: "text/event-stream" });
    if (cursor.lastId) headers["Last-Event-ID"] = cursor.lastId;
    let done = false;
    try {
      const resp = await fetch(path, { headers, signal });
      if (!resp.ok) {
        onState(`event stream refused: HTTP ${resp.status}`);
        if (resp.status < 500 && resp.status !== 429) return;
      } else {
        onState("live");
        pause = 250;
        done = await read(resp.body, signal, (ev) => {
          if (ev.id) cursor.lastId = ev.id;
          onEvent(ev);
        });
      }
    } catch (e) {
      if (signal.aborted) return;
      onState(`event stream dropped (${e.message}); reconnecting`);
    }
    if (done || signal.aborted) return;
    // A hang guard between attempts: the stream ended without its last event.
    await new Promise((r) => setTimeout(r, pause));
    pause = Math.min(pause * 2, 5000);
  }
}

/** Read one response's events; whether `session_completed` was among them. */
async function read(body, signal, emit) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  let ev = { event: "message", id: null, data: [] };
  let completed = false;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return completed;
    buf += value;
    let nl;
    while ((nl = buf.search(/\r\n|\r|\n/)) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + (buf.startsWith("\r\n", nl) ? 2 : 1));
      if (line === "") {
        if (ev.data.length) {
          const data = ev.data.join("\n");
          let parsed = null;
          try { parsed = JSON.parse(data); } catch { parsed = null; }
          emit({ event: ev.event, id: ev.id, data: parsed });
          if (ev.event === "session_completed") completed = true;
        }
        ev = { event: "message", id: null, data: [] };
        continue;
      }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let val = colon < 0 ? "" : line.slice(colon + 1);
      if (val.startsWith(" ")) val = val.slice(1);
      if (field === "event") ev.event = val;
      else if (field === "data") ev.data.push(val);
      else if (field === "id") ev.id = val;
    }
    if (completed) {
      reader.cancel().catch(() => {});
      return true;
    }
    if (signal.aborted) return false;
  }
}
