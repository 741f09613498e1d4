// Batches: their progress, counts, cost and ETA, and one batch's results as a download.

import { api, download } from "./api.js";
import { badge, clear, fmtCost, fmtSecs, fmtTime, h, notice, shortId } from "./dom.js";

function finished(b) {
  return b.counts.completed + b.counts.failed + b.counts.cancelled;
}

function progress(b) {
  const done = finished(b);
  return h("span", { class: "progress-cell" },
    h("progress", { max: Math.max(b.total, 1), value: done, "aria-label": `Batch ${b.id} progress` }),
    ` ${done}/${b.total}`);
}

export async function batchesPage(query) {
  const el = h("section", { class: "page", "aria-labelledby": "batches-h" }, h("h1", { id: "batches-h" }, "Batches"));
  const q = { limit: "50" };
  if (query.get("cursor")) q.cursor = query.get("cursor");
  try {
    const page = await api("/v1/batches", { query: q });
    const body = h("tbody");
    for (const b of page.batches) {
      body.append(h("tr", {},
        h("td", {}, h("a", { href: `#/batches/${encodeURIComponent(b.id)}`, class: "mono", "aria-label": `Batch ${b.id}` }, shortId(b.id))),
        h("td", {}, String(b.status)),
        h("td", {}, progress(b)),
        h("td", {}, `${b.counts.failed} failed, ${b.counts.running} running`),
        h("td", { class: "num" }, fmtCost(b.cost_usd)),
        h("td", {}, fmtSecs(b.eta_secs)),
        h("td", { class: "nowrap" }, fmtTime(b.created_at))));
    }
    if (!page.batches.length) body.append(h("tr", {}, h("td", { colSpan: 7 }, "No batches.")));
    el.append(h("div", { class: "scroll" }, h("table", { class: "list" },
      h("caption", { class: "sr-only" }, "Batches, newest first"),
      h("thead", {}, h("tr", {}, ["Batch", "Status", "Progress", "Counts", "Cost", "ETA", "Created"].map((t) => h("th", { scope: "col" }, t)))),
      body)));
    if (page.next_cursor) {
      el.append(h("nav", { class: "pager", "aria-label": "Pages of batches" },
        h("a", { href: "#/batches?" + new URLSearchParams({ cursor: page.next_cursor }) }, "Next page")));
    }
  } catch (e) {
    el.append(notice(`Cannot list batches: ${e.message}`, "error"));
  }
  return { el, title: "Batches" };
}

export async function batchPage(id) {
  const base = `/v1/batches/${encodeURIComponent(id)}`;
  const el = h("section", { class: "page", "aria-labelledby": "batch-h" }, h("h1", { id: "batch-h" }, "Batch ", h("span", { class: "mono" }, id)));
  const body = h("div");
  const status = h("div", { "aria-live": "polite" });
  el.append(body, status);
  const show = async () => {
    let b;
    try {
      b = await api(base);
    } catch (e) {
      clear(body).append(notice(`Cannot read the batch: ${e.message}`, "error"));
      return null;
    }
    const dl = h("dl", { class: "facts" });
    const fact = (k, ...v) => dl.append(h("dt", {}, k), h("dd", {}, ...v));
    fact("Status", String(b.status));
    fact("Progress", progress(b));
    for (const [k, v] of Object.entries(b.counts)) fact(k.replace("_", " "), badge(k), ` ${v}`);
    fact("Finish reasons", Object.entries(b.finish_reasons).map(([k, v]) => `${k}: ${v}`).join(", ") || "—");
    fact("Tokens", `${b.usage.input_tokens} in / ${b.usage.output_tokens} out`);
    fact("Cost", fmtCost(b.cost_usd));
    fact("ETA", fmtSecs(b.eta_secs));
    fact("Created", fmtTime(b.created_at));
    if (b.finished_at) fact("Finished", fmtTime(b.finished_at));
    clear(body).append(dl, h("div", { class: "actions" },
      h("a", { href: `#/sessions?batch_id=${encodeURIComponent(b.id)}` }, "Its sessions"),
      h("button", { type: "button", onclick: () => download(`${base}/results`, `${b.id}-results.jsonl`)
        .catch((e) => clear(status).append(notice(e.message, "error"))) }, "Download results (JSON Lines)"),
      ["completed", "cancelled"].includes(b.status) ? null : h("button", { type: "button", onclick: async () => {
        try { await api(`${base}/cancel`, { method: "POST" }); show(); } catch (e) { clear(status).append(notice(e.message, "error")); }
      } }, "Cancel batch")));
    return b;
  };
  const b = await show();
  const timer = setInterval(() => { if (b && !["completed", "cancelled"].includes(b.status)) show(); }, 3000);
  return { el, title: `Batch ${shortId(id)}`, stop: () => clearInterval(timer) };
}
