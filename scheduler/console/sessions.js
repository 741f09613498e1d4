// The sessions list: the server's own filters, kept in the URL so that a view can be
// shared; a page at a time by cursor; and bulk cancel and retry of what the filter
// selects, through the API's filter endpoints (never a loop over ids in the browser).

import { api, getKey, queryParams, schemaFields, serves } from "./api.js";
import { badge, clear, fmtCost, fmtTime, h, notice, shortId } from "./dom.js";
import { navigate } from "./app.js";

const STATUS = ["queued", "running", "waiting", "awaiting_approval", "completed", "failed", "cancelled"];
const FINISH = ["stop", "max_iterations", "interrupted", "timeout", "error", "yielded", "budget_exhausted", "stuck"];
const WAIT = ["children", "approval", "rate_limit", "budget"];

/** Every filter the console knows: (query name, label, kind, choices). Only those this
 * server's `GET /v1/sessions` takes are shown. */
const FILTERS = [
  ["q", "Search (id or prompt)", "search"],
  ["tenant", "Tenant", "text"],
  ["status", "Status", "select", STATUS],
  ["finish_reason", "Finish reason", "select", FINISH],
  ["wait_reason", "Wait reason", "select", WAIT],
  ["queue", "Queue", "text"],
  ["batch_id", "Batch id", "text"],
  ["parent_id", "Parent id", "text"],
  ["metadata", "Metadata (key=value)", "text"],
  ["created_after", "Created after", "datetime-local"],
  ["created_before", "Created before", "datetime-local"],
  ["min_cost_usd", "Min cost (USD)", "number"],
  ["max_cost_usd", "Max cost (USD)", "number"],
];

const PAGE = "50";

/** How often the counts refresh while the page is shown. */
const COUNTS_EVERY_MS = 5000;

let adminProbe = { key: null, answer: null };
/** Whether the key in use has the admin scope (only an admin may filter by tenant): asked
 * once per key, from an admin route that answers little. */
async function isAdmin() {
  const key = getKey();
  if (adminProbe.key !== key || adminProbe.answer === null) {
    adminProbe = { key, answer: api("/v1/admin/budgets").then(() => true, () => false) };
  }
  return adminProbe.answer;
}

export async function sessionsPage(query) {
  const [params, retryFields, admin] = await Promise.all([
    queryParams("/v1/sessions"),
    schemaFields("SessionFilter"),
    isAdmin(),
  ]);
  const filters = FILTERS.filter(([name]) => params.has(name) && (name !== "tenant" || admin));
  const el = h("section", { class: "page", "aria-labelledby": "sessions-h" },
    h("h1", { id: "sessions-h" }, "Sessions"));

  const form = h("form", { class: "filters", "aria-label": "Filter sessions" });
  for (const [name, label, kind, choices] of filters) {
    const id = `f-${name}`;
    let input;
    const value = query.get(name) || "";
    if (kind === "select") {
      input = h("select", { id, name },
        h("option", { value: "" }, "any"),
        choices.map((c) => h("option", { value: c, selected: c === value }, c)));
    } else {
      input = h("input", { id, name, type: kind, value, step: kind === "number" ? "any" : undefined,
        maxLength: name === "q" ? 200 : undefined });
    }
    form.append(h("div", { class: "field" }, h("label", { for: id }, label), input));
  }
  form.append(h("div", { class: "field actions" },
    h("button", { type: "submit" }, "Apply filters"),
    h("button", { type: "button", onclick: () => navigate("/sessions") }, "Clear filters")));
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const q = {};
    for (const [name] of filters) {
      const v = form.elements[name].value.trim();
      if (v) q[name] = v;
    }
    navigate("/sessions", q);
  });
  el.append(form);

  const apiQuery = new URLSearchParams();
  for (const [name] of filters) {
    for (const v of query.getAll(name)) {
      if (!v) continue;
      const isTime = name.startsWith("created_");
      apiQuery.append(name, isTime && !v.endsWith("Z") ? new Date(v).toISOString() : v);
    }
  }
  apiQuery.set("limit", PAGE);
  if (query.get("cursor")) apiQuery.set("cursor", query.get("cursor"));

  const counts = h("div", { class: "counts", role: "group", "aria-label": "Counts of matching sessions" });
  el.append(counts);
  let timer = null;
  if (await serves("get", "/v1/sessions/counts")) {
    const countQuery = new URLSearchParams(apiQuery);
    countQuery.delete("limit");
    countQuery.delete("cursor");
    const refresh = async () => {
      try {
        showCounts(counts, query, await api("/v1/sessions/counts", { query: countQuery }));
      } catch (e) {
        clear(counts);
        counts.append(notice(`Cannot count sessions: ${e.message}`, "error"));
      }
    };
    await refresh();
    timer = setInterval(refresh, COUNTS_EVERY_MS);
  }

  const status = h("div", { "aria-live": "polite" });
  const bulk = bulkActions(query, retryFields, status);
  el.append(bulk, status);

  const table = h("table", { class: "list" },
    h("caption", { class: "sr-only" }, "Sessions, newest first"),
    h("thead", {}, h("tr", {},
      ["Session", "Status", "Prompt", "Queue", "Iterations", "Created"].map((t) => h("th", { scope: "col" }, t)))));
  const body = h("tbody");
  table.append(body);
  el.append(h("div", { class: "scroll" }, table));
  const pager = h("nav", { class: "pager", "aria-label": "Pages of sessions" });
  el.append(pager);

  try {
    const page = await api("/v1/sessions", { query: apiQuery });
    for (const s of page.sessions) body.append(row(s));
    if (!page.sessions.length) {
      body.append(h("tr", {}, h("td", { colSpan: 6 }, "No session matches.")));
    }
    const summary = `${page.sessions.length} session(s) on this page` +
      (page.cost_usd !== undefined ? `, ${fmtCost(page.cost_usd)}` : "");
    pager.append(h("span", { class: "count" }, summary));
    const here = Object.fromEntries([...query.entries()]);
    if (query.get("cursor")) {
      const rest = { ...here };
      delete rest.cursor;
      pager.append(h("a", { href: "#/sessions?" + new URLSearchParams(rest) }, "First page"));
    }
    if (page.next_cursor) {
      pager.append(h("a", { href: "#/sessions?" + new URLSearchParams({ ...here, cursor: page.next_cursor }) },
        "Next page"));
    }
  } catch (e) {
    el.append(notice(`Cannot list sessions: ${e.message}`, "error"));
  }
  return { el, title: "Sessions", stop: () => clearInterval(timer) };
}

/** The counts of the filter, each status (and waiting reason) a link narrowing to it. */
function showCounts(box, query, c) {
  const here = Object.fromEntries([...query.entries()].filter(([k]) => k !== "cursor"));
  const link = (extra, text) => h("a", { href: "#/sessions?" + new URLSearchParams({ ...here, ...extra }) }, text);
  const items = [h("strong", { class: "total" }, `${c.total} matching`)];
  for (const st of STATUS) {
    const n = c.by_status[st];
    if (n) items.push(link({ status: st }, `${st.replace("_", " ")} ${n}`));
  }
  for (const r of WAIT) {
    const n = c.by_wait_reason[r];
    if (n) {
      const st = r === "approval" ? "awaiting_approval" : "waiting";
      items.push(link({ status: st, wait_reason: r }, `waiting for ${r.replace("_", " ")} ${n}`));
    }
  }
  if (!c.complete) items.push(h("span", { class: "muted" }, "(of the newest 5,000 read)"));
  clear(box);
  box.append(...items);
}

function row(s) {
  const prompt = String(s.prompt ?? "");
  return h("tr", { dataset: { id: s.id } },
    h("td", {}, h("a", { href: `#/sessions/${encodeURIComponent(s.id)}`, class: "mono",
      "aria-label": `Session ${s.id}` }, shortId(s.id))),
    h("td", {}, badge(s.status), s.finish_reason ? h("span", { class: "muted" }, ` ${s.finish_reason}`) : null,
      s.wait_reason ? h("span", { class: "muted" }, ` (${s.wait_reason})`) : null),
    h("td", { class: "prompt" }, prompt.length > 120 ? prompt.slice(0, 120) + "…" : prompt),
    h("td", {}, s.queue ?? ""),
    h("td", { class: "num" }, String(s.iterations ?? 0)),
    h("td", { class: "nowrap" }, fmtTime(s.created_at)));
}

/** Bulk cancel (by batch, as the API requires) and bulk retry of the failed sessions the
 * filter selects; each asks for a second click before it acts. */
function bulkActions(query, retryFields, status) {
  const box = h("div", { class: "bulk", role: "group", "aria-label": "Act on every matching session" });
  const filter = {};
  for (const f of ["batch_id", "status"]) {
    if (query.get(f) && retryFields.has(f)) filter[f] = query.get(f);
  }
  const batch = query.get("batch_id");
  const act = async (what, path, body) => {
    clear(status);
    let n = 0;
    let cursor = null;
    try {
      do {
        const r = await api(path, { method: "POST", body: cursor ? { ...body, cursor } : body });
        n += r.sessions.length;
        cursor = r.next_cursor;
      } while (cursor);
      status.append(notice(`${what}: ${n} session(s).`));
    } catch (e) {
      status.append(notice(`${what} failed: ${e.message}`, "error"));
    }
  };
  const confirmButton = (label, run) => {
    const b = h("button", { type: "button" }, label);
    b.addEventListener("click", () => {
      if (b.dataset.armed) {
        delete b.dataset.armed;
        b.textContent = label;
        run();
      } else {
        b.dataset.armed = "1";
        b.textContent = `Confirm: ${label.toLowerCase()}`;
      }
    });
    return b;
  };
  box.append(confirmButton("Retry failed matching", () => act("Retried", "/v1/sessions/retry", filter)));
  if (batch) {
    box.append(confirmButton("Cancel batch's unfinished", () =>
      act("Cancelled", "/v1/sessions/cancel", { batch_id: batch })));
  } else {
    box.append(h("span", { class: "muted" }, " Bulk cancel needs a batch id filter."));
  }
  return box;
}
