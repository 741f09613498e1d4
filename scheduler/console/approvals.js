// The approvals inbox: every call held for a human across the caller's sessions, oldest
// deadline first, each decided in one click. From `GET /v1/approvals` where the server has
// it; otherwise gathered from the sessions awaiting approval (their first page).

import { api, serves } from "./api.js";
import { clear, h, notice, shortId } from "./dom.js";
import { approvalCard } from "./session.js";
import { schemaFields } from "./api.js";

export async function approvalsPage(query) {
  const el = h("section", { class: "page", "aria-labelledby": "inbox-h" }, h("h1", { id: "inbox-h" }, "Approvals"));
  const status = h("div", { "aria-live": "polite" });
  const list = h("div", { class: "inbox" });
  el.append(status, list);
  const fields = await schemaFields("ApprovalRequest");
  const reload = async () => {
    let held;
    try {
      held = await inbox(query);
    } catch (e) {
      clear(list).append(notice(`Cannot read the inbox: ${e.message}`, "error"));
      return;
    }
    clear(list);
    if (!held.length) { list.append(h("p", { class: "muted" }, "Nothing waits for a decision.")); return; }
    held.sort((a, b) => String(a.deadline ?? "9").localeCompare(String(b.deadline ?? "9")));
    for (const p of held) {
      const base = `/v1/sessions/${encodeURIComponent(p.session_id)}`;
      list.append(h("div", { class: "inbox-item" },
        h("a", { href: `#${base.slice(3)}`, "aria-label": `Session ${p.session_id}` }, `Session ${shortId(p.session_id)}`),
        approvalCard(base, p, fields, status, () => {})));
    }
  };
  await reload();
  // New held calls appear by themselves, but never under the hands of someone typing a
  // reason or an edit.
  const timer = setInterval(() => { if (!list.contains(document.activeElement)) reload(); }, 5000);
  return { el, title: "Approvals", stop: () => clearInterval(timer) };
}

async function inbox(query) {
  if (await serves("get", "/v1/approvals")) {
    const q = {};
    for (const k of ["queue", "batch_id", "tool", "session_id"]) if (query.get(k)) q[k] = query.get(k);
    q.limit = "100";
    const r = await api("/v1/approvals", { query: q });
    return r.approvals;
  }
  const page = await api("/v1/sessions", { query: { status: "awaiting_approval", limit: "50" } });
  const details = await Promise.all(page.sessions.map((s) => api(`/v1/sessions/${encodeURIComponent(s.id)}`)));
  return details.flatMap((d) => (d.pending_approvals || []).map((p) => ({ ...p, session_id: d.id })));
}
