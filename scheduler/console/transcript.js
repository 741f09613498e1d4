// A session's transcript, built event by event: each event appends to the step it
// belongs to (a text delta to that step's text node), so a stream of thousands of events
// never re-renders what is already shown. Steps off screen are skipped by the browser's
// layout (`content-visibility: auto` in the style sheet), and events are put into the
// page once per animation frame, so a session of 2,000 iterations opens and scrolls.

import { fmtTokens, h, longText, pretty } from "./dom.js";

export class Transcript {
  /** `fork(k)`, when given, is offered on each finished step k ("Fork from here"). */
  constructor({ fork } = {}) {
    this.fork = fork;
    this.el = h("ol", { class: "transcript", "aria-label": "Transcript" });
    this.steps = new Map(); // seq -> {li, text, thinking}
    this.calls = new Map(); // tool call id -> element for its result
    this.queue = [];
    this.scheduled = false;
    this.follow = true;
  }

  /** Take one event of the stream (shown at the next frame). */
  push(ev) {
    this.queue.push(ev);
    if (!this.scheduled) {
      this.scheduled = true;
      requestAnimationFrame(() => this.flush());
    }
  }

  flush() {
    this.scheduled = false;
    const scroller = document.scrollingElement;
    const atEnd = scroller.scrollTop + window.innerHeight >= scroller.scrollHeight - 40;
    const batch = this.queue;
    this.queue = [];
    for (const ev of batch) this.apply(ev);
    if (atEnd && this.follow && batch.length) scroller.scrollTop = scroller.scrollHeight;
  }

  step(seq, label) {
    let s = this.steps.get(seq);
    if (!s) {
      const li = h("li", { class: "step", dataset: { seq: String(seq) } },
        h("div", { class: "step-h" }, label));
      s = { li, text: null, thinking: null };
      this.steps.set(seq, s);
      this.insert(li, seq);
    }
    return s;
  }

  /** Steps stay in order of their position even when a replay delivers them late. */
  insert(li, seq) {
    const last = this.el.lastElementChild;
    if (!last || Number(last.dataset.seq) <= seq) {
      this.el.append(li);
      return;
    }
    for (const other of this.el.children) {
      if (Number(other.dataset.seq) > seq) {
        other.before(li);
        return;
      }
    }
    this.el.append(li);
  }

  apply({ event, data }) {
    if (!data) return;
    const seq = Number(data.seq ?? 0);
    switch (event) {
      case "reset":
        // Another worker redoes the steps from `seq` on: forget what was shown of them.
        for (const [k, s] of this.steps) {
          if (k >= seq) { s.li.remove(); this.steps.delete(k); }
        }
        return;
      case "iteration_started":
        this.step(seq, `Step ${data.iteration}`);
        return;
      case "text_delta": {
        const s = this.step(seq, "Answer");
        if (!s.text) { s.text = h("p", { class: "answer" }); s.li.append(s.text); }
        s.text.append(document.createTextNode(data.text ?? ""));
        return;
      }
      case "thinking_delta": {
        const s = this.step(seq, "Thinking");
        if (!s.thinking) {
          s.thinking = h("pre", { class: "thinking" });
          s.li.append(h("details", { class: "think" }, h("summary", {}, "Thinking"), s.thinking));
        }
        s.thinking.append(document.createTextNode(data.text ?? ""));
        return;
      }
      case "tool_call":
      case "approval_requested": {
        const s = this.step(seq, "Tools");
        const held = event === "approval_requested";
        const args = pretty(data.arguments);
        const result = h("div", { class: "result" });
        this.calls.set(data.id, result);
        s.li.append(h("div", { class: held ? "call held" : "call" },
          h("div", {}, held ? "⏸ held for approval: " : "→ ", h("code", {}, String(data.name ?? "")),
            h("span", { class: "muted" }, ` ${data.id ?? ""}`)),
          args.length > 400 ? collapsed("Arguments", args) : h("pre", { class: "text" }, args),
          result));
        return;
      }
      case "tool_result": {
        // Beside its call when that is shown; a step of its own otherwise.
        const target = this.calls.get(data.id) || this.step(seq, "Tool result").li;
        const text = String(data.content ?? "");
        target.append(h("div", { class: data.is_error ? "tool-result error" : "tool-result" },
          h("span", { class: "muted" }, data.is_error ? "✗ error from " : "← ", String(data.name ?? "")),
          text.length > 400 ? collapsed(`Result (${text.length} chars)`, text) : h("pre", { class: "text" }, text)));
        return;
      }
      case "approval_decided": {
        const target = this.calls.get(data.id) || this.step(seq, "Approval").li;
        target.append(h("p", { class: data.approved ? "decided ok" : "decided no" },
          data.approved ? "approved" : `denied${data.reason ? `: ${data.reason}` : ""}`));
        return;
      }
      case "iteration_completed": {
        const s = this.step(seq, `Step ${data.iteration}`);
        s.li.append(h("p", { class: "usage muted" }, `tokens: ${fmtTokens(data.usage)}`));
        const k = Number(data.iteration);
        if (this.fork && Number.isInteger(k) && !s.li.querySelector("button.fork")) {
          s.li.append(h("button", {
            type: "button", class: "fork", "aria-label": `Fork from step ${k}`,
            onclick: () => this.fork(k),
          }, "Fork from here"));
        }
        return;
      }
      case "error":
        this.step(seq, "Error").li.append(h("p", { class: "notice error" },
          `${data.message ?? ""}${data.retrying ? " (retrying)" : ""}`));
        return;
      case "session_waiting":
        this.step(seq, "Waiting").li.append(h("p", { class: "muted" },
          `waiting: ${data.reason ?? ""}${data.wake_at ? ` until ${data.wake_at}` : ""}`));
        return;
      case "rate_limited":
        this.step(seq, "Rate limited").li.append(h("p", { class: "muted" },
          `rate limited (${data.reason ?? ""}) for ${data.wait_ms ?? 0} ms`));
        return;
      case "session_completed": {
        const s = this.step(seq, "Finished");
        s.li.classList.add("final");
        s.li.append(h("p", {}, `Finished: ${data.finish_reason ?? "unknown"} after ${data.iterations ?? 0} iteration(s), ${fmtTokens(data.usage)}`));
        if (data.error) s.li.append(h("p", { class: "notice error" }, String(data.error)));
        return;
      }
      default:
        return;
    }
  }
}

/** A long value shown only when opened: its text enters the page on the first toggle. */
function collapsed(label, text) {
  const d = h("details", { class: "collapsed" }, h("summary", {}, label));
  d.addEventListener("toggle", () => {
    if (d.open && d.childElementCount === 1) d.append(longText(text, 20000, label.toLowerCase()));
  }, { once: false });
  return d;
}
