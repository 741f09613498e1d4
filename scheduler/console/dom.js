// Building the page from data without ever parsing data as markup: every string from the
// API (prompts, model output, tool arguments, file names, metadata) is hostile, so it only
// ever becomes a text node or a property value. Nothing here assigns innerHTML.

/** An element: `attrs` are properties or attributes (`on*` functions are listeners),
 * children are nodes or strings (as text). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") {
      el.addEventListener(k.slice(2), v);
    } else if (k === "class") {
      el.className = v;
    } else if (k === "dataset") {
      Object.assign(el.dataset, v);
    } else if (k === "href") {
      el.setAttribute("href", safeHref(v));
    } else if (k in el && !k.includes("-")) {
      el[k] = v;
    } else {
      el.setAttribute(k, v === true ? "" : String(v));
    }
  }
  append(el, children);
  return el;
}

/** Only the console's own hash links and blob downloads are ever links. */
function safeHref(v) {
  const s = String(v);
  return s.startsWith("#") || s.startsWith("blob:") ? s : "#";
}

export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

export function fmtTime(t) {
  if (!t) return "";
  const d = new Date(t);
  return isNaN(d) ? String(t) : d.toISOString().replace("T", " ").slice(0, 19);
}

export function fmtCost(usd) {
  if (usd === null || usd === undefined) return "—";
  if (usd === 0) return "$0";
  return "$" + Number(usd).toFixed(usd < 0.01 ? 5 : 4);
}

export function fmtTokens(usage) {
  if (!usage) return "—";
  return `${usage.input_tokens ?? 0} in / ${usage.output_tokens ?? 0} out`;
}

export function fmtSecs(s) {
  if (s === null || s === undefined) return "—";
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
}

/** The end of an id: ids are time-ordered, so their starts are alike and their ends
 * tell them apart. */
export function shortId(id) {
  const s = String(id ?? "");
  return s.length > 12 ? "…" + s.slice(-12) : s;
}

/** A status as a badge (its class is chosen from a fixed list, never from data). */
const STATUSES = ["queued", "running", "waiting", "awaiting_approval", "completed", "failed", "cancelled"];
export function badge(status) {
  const cls = STATUSES.includes(status) ? status : "other";
  return h("span", { class: `badge s-${cls}` }, String(status ?? ""));
}

/** A status line for errors and outcomes, announced to screen readers. */
export function notice(text, kind = "info") {
  return h("p", { class: `notice ${kind === "error" ? "error" : "info"}`, role: kind === "error" ? "alert" : "status" }, text);
}

/** JSON, indented, as text. */
export function pretty(v) {
  try {
    return typeof v === "string" ? v : JSON.stringify(v, null, 2);
  } catch {
    return String(v);
  }
}

/** A block of text that may be long: the first `limit` characters shown, the rest
 * behind a button and only put into the page when asked for. */
export function longText(text, limit = 600, label = "text") {
  const s = String(text ?? "");
  if (s.length <= limit) return h("pre", { class: "text" }, s);
  const pre = h("pre", { class: "text" }, s.slice(0, limit) + "…");
  const btn = h("button", {
    type: "button", class: "link",
    "aria-label": `Show all ${s.length} characters of the ${label}`,
    onclick: () => { pre.textContent = s; btn.remove(); },
  }, `Show all (${s.length} chars)`);
  return h("div", { class: "long" }, pre, btn);
}
