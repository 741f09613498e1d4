// Operations and costs: what the admin endpoints of this API expose (queues, waits and
// workers, the rate limiter, tenants' budgets and spend, costs per tenant, model and day).

import { api } from "./api.js";
import { clear, fmtCost, fmtTime, h, notice } from "./dom.js";

function table(caption, heads, rows) {
  return h("div", { class: "scroll" }, h("table", { class: "list" }, h("caption", {}, caption),
    h("thead", {}, h("tr", {}, heads.map((t) => h("th", { scope: "col" }, t)))),
    h("tbody", {}, rows.length ? rows.map((r) => h("tr", {}, r.map((c) => h("td", {}, c))))
      : h("tr", {}, h("td", { colSpan: heads.length }, "None.")))));
}

async function section(title, id, load) {
  const s = h("section", { class: "panel", "aria-labelledby": id }, h("h2", { id }, title));
  try {
    s.append(...[await load()].flat());
  } catch (e) {
    s.append(notice(e.status === 403 ? `${title}: needs a key with the admin scope.` : `${title}: ${e.message}`, "error"));
  }
  return s;
}

const num = (n) => (n === null || n === undefined ? "—" : String(n));

export async function opsPage() {
  const el = h("section", { class: "page", "aria-labelledby": "ops-h" }, h("h1", { id: "ops-h" }, "Operations"));
  // One read for the queues, the waits and the workers; each section shows its part.
  const ops = api("/v1/admin/operations");
  el.append(
    await section("Queues", "q-h", async () => {
      const o = await ops;
      return table(`${o.queues.length} queue(s)`, ["Queue", "Length", "Pending", "Held", "Sessions"],
        o.queues.map((q) => [q.name, q.error ? q.error : num(q.length), num(q.pending), String(q.held),
          h("a", { href: `#/sessions?${new URLSearchParams({ queue: q.name })}` }, `list ${q.name}`)]));
    }),
    await section("Waiting sessions", "w-h", async () => {
      const o = await ops;
      return table("Sessions waiting, by reason", ["Reason", "Sessions"],
        Object.entries(o.waiting).map(([r, n]) => [
          h("a", { href: `#/sessions?${new URLSearchParams({ status: r === "approval" ? "awaiting_approval" : "waiting", wait_reason: r })}` },
            `waiting for ${r.replace("_", " ")}`),
          String(n)]));
    }),
    await section("Workers", "wk-h", async () => {
      const o = await ops;
      const caption = o.workers_truncated ? `The first ${o.workers.length} workers holding leases` : "Workers holding leases";
      return table(caption, ["Worker", "Running sessions", "First lease expires", "Last lease expires"],
        o.workers.map((w) => [w.worker, String(w.sessions), fmtTime(w.first_lease_expiry), fmtTime(w.last_lease_expiry)]));
    }),
    await section("Rate limiter", "l-h", async () => {
      const l = await api("/v1/admin/limits");
      if (!l.enabled) return h("p", {}, "No fleet-wide limiter (it needs Redis).");
      return [
        table("Rules in use", ["Key", "Requests", "Tokens", "In flight", "Window"],
          l.rules.map((r) => [r.key, `${r.requests}/${r.requests_per_window}`, `${r.tokens}/${r.tokens_per_window}`,
            `${r.in_flight}/${r.concurrency}`, `${r.window_ms} ms`])),
        table("Holds from providers", ["Key", "Until"], l.holds.map((x) => [x.key, fmtTime(x.until)])),
      ];
    }),
    await section("Budgets", "b-h", async () => {
      const b = await api("/v1/admin/budgets");
      return table("Tenants' budgets", ["Tenant", "Period", "Tokens", "USD", "Spent tokens", "Spent", "On budget"],
        b.budgets.map((x) => [x.tenant, x.period, String(x.tokens ?? "—"), x.usd === null ? "—" : fmtCost(x.usd),
          String(x.spent_tokens), fmtCost(x.spent_usd), x.on_budget]));
    }),
  );
  return { el, title: "Operations" };
}

export async function costsPage() {
  const el = h("section", { class: "page", "aria-labelledby": "costs-h" }, h("h1", { id: "costs-h" }, "Costs"));
  el.append(await section("Per tenant, model and day", "c-h", async () => {
    const c = await api("/v1/admin/costs");
    return [
      table(`Sessions created ${fmtTime(c.since)} to ${fmtTime(c.until)}: ${fmtCost(c.cost_usd)}`,
        ["Day", "Tenant", "Model", "Sessions", "Input tokens", "Output tokens", "Cache read", "Cost"],
        c.rows.map((r) => [r.day, r.tenant, r.model ?? "—", String(r.sessions), String(r.input_tokens),
          String(r.output_tokens), String(r.cache_read_tokens), r.cost_usd === null ? "no price" : fmtCost(r.cost_usd)])),
      c.truncated ? notice("More rows than one answer holds: the oldest are left out.") : null,
    ].filter(Boolean);
  }));
  const out = h("div", { "aria-live": "polite" });
  const input = h("input", { id: "spend-tenant", type: "text", required: true });
  const form = h("form", { class: "filters", "aria-label": "A tenant's spend" },
    h("div", { class: "field" }, h("label", { for: "spend-tenant" }, "Tenant"), input),
    h("div", { class: "field actions" }, h("button", { type: "submit" }, "Show spend")));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    clear(out);
    try {
      const s = await api(`/v1/admin/tenants/${encodeURIComponent(input.value.trim())}/spend`);
      out.append(table(`Spend of ${s.tenant}`, ["Period", "Tokens", "Cost"],
        [["today", String(s.day.tokens), fmtCost(s.day.usd)], ["this month", String(s.month.tokens), fmtCost(s.month.usd)]]));
    } catch (err) {
      out.append(notice(err.status === 403 ? "Spend needs a key with the admin scope." : err.message, "error"));
    }
  });
  el.append(h("section", { class: "panel", "aria-labelledby": "spend-h" }, h("h2", { id: "spend-h" }, "A tenant's spend"), form, out));
  el.append(await section("Budgets and spend", "bs-h", async () => {
    const b = await api("/v1/admin/budgets");
    return table("Spend against budgets", ["Tenant", "Period", "Spent tokens", "Spent"],
      b.budgets.map((x) => [x.tenant, x.period, String(x.spent_tokens), fmtCost(x.spent_usd)]));
  }));
  return { el, title: "Costs" };
}
