// Operations and costs: what the admin endpoints of this API expose (queues, the rate
// limiter, tenants' budgets and spend), and a plain statement of what they do not.

import { api, serves } from "./api.js";
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

const missing = (what) => h("p", { class: "muted" }, `Not available: ${what}`);

export async function opsPage() {
  const el = h("section", { class: "page", "aria-labelledby": "ops-h" }, h("h1", { id: "ops-h" }, "Operations"));
  el.append(
    await section("Queues", "q-h", async () => {
      const q = await api("/v1/queues");
      return [table(`${q.queues.length} of at most ${q.max_queues} queues`, ["Queue", "Sessions"],
        q.queues.map((name) => [name, h("a", { href: `#/sessions?${new URLSearchParams({ queue: name })}` }, "list")])),
      missing("queue length, pending and held counts are on the metrics listener (/metrics), not the API.")];
    }),
    await section("Waiting sessions", "w-h", async () => {
      const links = ["children", "approval", "rate_limit", "budget"].map((r) =>
        h("li", {}, h("a", { href: `#/sessions?${new URLSearchParams({ status: r === "approval" ? "awaiting_approval" : "waiting", wait_reason: r })}` }, `waiting for ${r.replace("_", " ")}`)));
      return [h("ul", {}, links), missing("counts by reason are on /metrics (agentq_sessions_waiting); workers and their leases have no API.")];
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
  if (await serves("get", "/v1/admin/costs")) {
    el.append(await section("Per tenant, model and day", "c-h", async () => {
      const c = await api("/v1/admin/costs");
      return table("Cost", ["Day", "Tenant", "Model", "Input tokens", "Output tokens", "Cost"],
        (c.rows || []).map((r) => [r.day, r.tenant, r.model, String(r.input_tokens), String(r.output_tokens), fmtCost(r.cost_usd)]));
    }));
  } else {
    el.append(missing("a per-model and per-day breakdown: this API has no endpoint for it yet; what it has is each tenant's spend today and this month (below), each session's and tree's cost (on its page) and each batch's (on Batches)."));
  }
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
