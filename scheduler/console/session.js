// One session: its state and cost, the live transcript (transcript.js over sse.js), the
// calls it holds for a decision, a message box, cancel and retry, its files, and the
// sub-agent tree it belongs to.

import { api, blob, download, schemaFields } from "./api.js";
import { badge, clear, fmtCost, fmtTime, fmtTokens, h, notice, pretty, shortId } from "./dom.js";
import { follow } from "./sse.js";
import { Transcript } from "./transcript.js";

const TERMINAL = ["completed", "failed", "cancelled"];
const PREVIEW_BYTES = 256 * 1024;

export async function sessionPage(id) {
  const base = `/v1/sessions/${encodeURIComponent(id)}`;
  const ctl = new AbortController();
  const approvalFields = await schemaFields("ApprovalRequest");
  const el = h("section", { class: "page session", "aria-labelledby": "session-h" });
  const head = h("div", { class: "session-head" });
  const approvals = h("section", { class: "panel", "aria-labelledby": "appr-h" });
  const live = h("p", { class: "muted stream-state", "aria-live": "polite" }, "connecting…");
  const status = h("div", { "aria-live": "polite" });
  // A fork of this session from a finished step: a new session, opened at once.
  const fork = async (k) => {
    clear(status);
    try {
      const r = await api(`${base}/fork`, { method: "POST", body: { at_iteration: k } });
      location.hash = `/sessions/${encodeURIComponent(r.id)}`;
    } catch (e) {
      status.append(notice(`Fork from step ${k} failed: ${e.message}`, "error"));
    }
  };
  const transcript = new Transcript({ fork });
  const files = h("section", { class: "panel", "aria-labelledby": "files-h" });
  const tree = h("section", { class: "panel", "aria-labelledby": "tree-h" });
  el.append(
    h("h1", { id: "session-h" }, "Session ", h("span", { class: "mono" }, id)),
    head, status, approvals,
    h("section", { class: "panel", "aria-labelledby": "tr-h" },
      h("h2", { id: "tr-h" }, "Transcript"), live, transcript.el),
    messageBox(base, status, () => restartStream()),
    files, tree);

  let detail = null;
  const refresh = async () => {
    try {
      detail = await api(base, { signal: ctl.signal });
    } catch (e) {
      if (ctl.signal.aborted) return;
      clear(head).append(notice(`Cannot read the session: ${e.message}`, "error"));
      return;
    }
    showHead(head, detail, base, status, () => { refresh(); restartStream(); });
    showApprovals(approvals, detail, base, approvalFields, status, refresh);
  };

  const cursor = {};
  let streaming = false;
  const restartStream = () => {
    if (streaming || ctl.signal.aborted) return;
    streaming = true;
    follow(`${base}/events`, {
      cursor,
      signal: ctl.signal,
      onState: (s) => { live.textContent = s; },
      onEvent: (ev) => {
        transcript.push(ev);
        if (["approval_requested", "approval_decided", "session_completed", "session_waiting"].includes(ev.event)) {
          refresh();
        }
        if (ev.event === "session_completed") { refresh(); showFiles(files, base); showTree(tree, detail); }
      },
    }).finally(() => {
      streaming = false;
      if (!ctl.signal.aborted) live.textContent = "the stream has ended (the session finished)";
    });
  };

  await refresh();
  restartStream();
  showFiles(files, base);
  showTree(tree, detail);
  // The state that no event announces (a session suspending for approval, a worker's
  // claim) is read again while the session has not finished.
  const timer = setInterval(() => {
    if (detail && !TERMINAL.includes(detail.status)) refresh();
  }, 2000);
  return { el, title: `Session ${shortId(id)}`, stop: () => { ctl.abort(); clearInterval(timer); } };
}

function showHead(head, d, base, status, afterAction) {
  clear(head);
  const dl = h("dl", { class: "facts" });
  const fact = (k, ...v) => dl.append(h("dt", {}, k), h("dd", {}, ...v));
  fact("Status", badge(d.status), d.finish_reason ? ` ${d.finish_reason}` : "",
    d.wait_reason ? ` (waiting: ${d.wait_reason})` : "", d.cancel_requested ? " (cancel requested)" : "");
  fact("Queue", String(d.queue ?? ""));
  fact("Iterations", String(d.iterations ?? 0));
  fact("Tokens", fmtTokens(d.usage));
  fact("Cost", fmtCost(d.cost_usd));
  if (d.tree_cost) fact("Tree cost", `${fmtCost(d.tree_cost.cost_usd)} over ${d.tree_cost.sessions} session(s)`);
  fact("Created", fmtTime(d.created_at));
  if (d.finished_at) fact("Finished", fmtTime(d.finished_at));
  if (d.parent_id) fact("Parent", h("a", { href: `#/sessions/${encodeURIComponent(d.parent_id)}` }, d.parent_id));
  if (d.forked_from) {
    fact("Forked from", h("a", { href: `#/sessions/${encodeURIComponent(d.forked_from)}` }, d.forked_from));
  }
  if (d.batch_id) fact("Batch", h("a", { href: `#/batches/${encodeURIComponent(d.batch_id)}` }, d.batch_id));
  if (d.attempts) fact("Attempts", String(d.attempts));
  const meta = d.metadata && Object.keys(d.metadata).length ? pretty(d.metadata) : null;
  if (meta) fact("Metadata", h("pre", { class: "text" }, meta));
  head.append(h("div", { class: "prompt-box" }, h("h2", {}, "Prompt"), h("pre", { class: "text" }, String(d.prompt ?? ""))));
  if (d.result) head.append(h("div", { class: "prompt-box" }, h("h2", {}, "Result"), h("pre", { class: "text result-text" }, String(d.result))));
  if (d.error) head.append(notice(`Error: ${d.error}`, "error"));
  head.append(dl);
  const act = async (label, path) => {
    clear(status);
    try {
      const r = await api(path, { method: "POST" });
      status.append(notice(`${label}: now ${r.status}${r.cancel_requested ? " (its worker stops it)" : ""}.`));
      afterAction();
    } catch (e) {
      status.append(notice(`${label} failed: ${e.message}`, "error"));
    }
  };
  const actions = h("div", { class: "actions", role: "group", "aria-label": "Session actions" });
  if (!TERMINAL.includes(d.status)) actions.append(h("button", { type: "button", onclick: () => act("Cancel", `${base}/cancel`) }, "Cancel session"));
  if (d.status === "failed") actions.append(h("button", { type: "button", onclick: () => act("Retry", `${base}/retry`) }, "Retry session"));
  head.append(actions);
}

function showApprovals(box, d, base, fields, status, refresh) {
  const pending = d.pending_approvals || [];
  // Drawn again only when the held calls change: a reason or an edit being typed stays.
  const ids = pending.map((p) => p.tool_call_id).join("\n");
  if (box.dataset.ids === ids && box.childElementCount) return;
  box.dataset.ids = ids;
  clear(box);
  box.hidden = pending.length === 0;
  if (!pending.length) return;
  box.append(h("h2", { id: "appr-h" }, `Held for approval (${pending.length})`));
  for (const p of pending) box.append(approvalCard(base, p, fields, status, refresh));
}

/** One held call with approve, deny (with a reason) and, where the server takes edited
 * arguments, approve-with-edits. Shared with the approvals inbox. */
export function approvalCard(base, p, fields, status, after) {
  const decide = async (body, label) => {
    clear(status);
    try {
      await api(`${base}/approvals`, { method: "POST", body: { tool_call_id: p.tool_call_id, ...body } });
      status.append(notice(`${label} ${p.tool} (${p.tool_call_id}).`));
      card.remove();
      after();
    } catch (e) {
      status.append(notice(`${label} failed: ${e.message}`, "error"));
    }
  };
  const what = `${p.tool} call ${p.tool_call_id}`;
  const reasonId = `reason-${p.tool_call_id}-${Math.random().toString(36).slice(2)}`;
  const reason = h("input", { id: reasonId, type: "text", placeholder: "shown to the model" });
  const card = h("div", { class: "approval", role: "group", "aria-label": `Held ${what}` },
    h("div", {}, h("code", {}, String(p.tool)), h("span", { class: "muted" }, ` ${p.tool_call_id}`),
      p.deadline ? h("span", { class: "muted" }, ` · deadline ${fmtTime(p.deadline)}`) : null),
    h("pre", { class: "text" }, pretty(p.arguments)),
    h("div", { class: "actions" },
      h("button", { type: "button", class: "primary", "aria-label": `Approve ${what}`,
        onclick: () => decide({ approve: true }, "Approved") }, "Approve"),
      h("label", { for: reasonId }, "Reason"), reason,
      h("button", { type: "button", "aria-label": `Deny ${what}`,
        onclick: () => decide({ approve: false, reason: reason.value || undefined }, "Denied") }, "Deny")));
  if (fields.has("arguments")) {
    const editId = `edit-${reasonId}`;
    const edit = h("textarea", { id: editId, rows: 4, spellcheck: false, value: pretty(p.arguments) });
    card.append(h("details", {}, h("summary", {}, "Approve with edited arguments"),
      h("label", { for: editId }, "Arguments (JSON)"), edit,
      h("button", { type: "button", "aria-label": `Approve ${what} with edited arguments`, onclick: () => {
        let args;
        try { args = JSON.parse(edit.value); } catch (e) {
          clear(status).append(notice(`The arguments are not JSON: ${e.message}`, "error"));
          return;
        }
        decide({ approve: true, arguments: args }, "Approved with edits");
      } }, "Approve edited")));
  }
  return card;
}

function messageBox(base, status, after) {
  const text = h("textarea", { id: "msg", rows: 3, required: true });
  const strategy = h("select", { id: "msg-strategy" },
    ["inject", "enqueue", "interrupt"].map((s) => h("option", { value: s }, s)));
  const form = h("form", { class: "panel message", "aria-labelledby": "msg-h" },
    h("h2", { id: "msg-h" }, "Message the session"),
    h("label", { for: "msg" }, "Message"), text,
    h("div", { class: "actions" }, h("label", { for: "msg-strategy" }, "Delivery"), strategy,
      h("button", { type: "submit" }, "Send message")));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    clear(status);
    try {
      const r = await api(`${base}/messages`, { method: "POST", body: { content: text.value, strategy: strategy.value } });
      status.append(notice(`Message taken (${r.delivery}).`));
      text.value = "";
      after();
    } catch (err) {
      status.append(notice(`Message refused: ${err.message}`, "error"));
    }
  });
  return form;
}

function filePath(base, path) {
  return `${base}/files/${path.split("/").map(encodeURIComponent).join("/")}`;
}

async function showFiles(box, base) {
  let list;
  try {
    list = await api(`${base}/files`);
  } catch (e) {
    clear(box).append(h("h2", { id: "files-h" }, "Files"), notice(`Cannot list files: ${e.message}`, "error"));
    return;
  }
  clear(box).append(h("h2", { id: "files-h" }, `Files (${list.files.length})`));
  if (!list.files.length) { box.append(h("p", { class: "muted" }, "No files.")); return; }
  const preview = h("div", { class: "preview", "aria-live": "polite" });
  const ul = h("ul", { class: "files" });
  for (const f of list.files) {
    ul.append(h("li", {},
      h("span", { class: "mono" }, f.path), h("span", { class: "muted" }, ` ${f.size} bytes `),
      h("button", { type: "button", "aria-label": `Download ${f.path}`, onclick: () =>
        download(filePath(base, f.path), f.path).catch((e) => clear(preview).append(notice(e.message, "error"))) }, "Download"),
      f.size <= PREVIEW_BYTES ? h("button", { type: "button", "aria-label": `Preview ${f.path}`, onclick: async () => {
        try {
          const text = await (await blob(filePath(base, f.path))).text();
          clear(preview).append(h("h3", {}, f.path), h("pre", { class: "text" }, text));
        } catch (e) {
          clear(preview).append(notice(e.message, "error"));
        }
      } }, "Preview") : null));
  }
  box.append(ul, preview);
}

async function showTree(box, d) {
  if (!d) return;
  let root;
  try {
    root = await api(`/v1/sessions/${encodeURIComponent(d.root_id)}/tree`);
  } catch (e) {
    clear(box).append(h("h2", { id: "tree-h" }, "Sub-agents"), notice(`Cannot read the tree: ${e.message}`, "error"));
    return;
  }
  clear(box).append(h("h2", { id: "tree-h" }, "Sub-agent tree"));
  if (!root.children.length) { box.append(h("p", { class: "muted" }, "No sub-agents.")); return; }
  box.append(h("ul", { class: "tree" }, node(root, d.id)));
}

/** Tokens of a node and its descendants. */
function rollup(n) {
  const own = (n.usage?.input_tokens ?? 0) + (n.usage?.output_tokens ?? 0);
  return n.children.reduce((sum, c) => sum + rollup(c), own);
}

function node(n, current) {
  const label = `${shortId(n.id)} ${String(n.prompt ?? "").slice(0, 60)}`;
  const link = n.id === current
    ? h("strong", { "aria-current": "page" }, label)
    : h("a", { href: `#/sessions/${encodeURIComponent(n.id)}` }, label);
  return h("li", {}, link, " ", badge(n.status), h("span", { class: "muted" }, ` ${rollup(n)} tokens with sub-agents`),
    n.children.length ? h("ul", {}, n.children.map((c) => node(c, current))) : null);
}
