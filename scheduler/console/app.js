// The console's shell: the key form, the navigation and the router. Pages live in the
// URL's fragment (`#/sessions?status=failed`), so a view can be shared and reloaded, and
// the fragment never reaches a server log. Each page renders into <main> and returns a
// function that stops what it started (an event stream, a poll).

import { getKey, setKey } from "./api.js";
import { clear, h } from "./dom.js";
import { sessionsPage } from "./sessions.js";
import { sessionPage } from "./session.js";
import { approvalsPage } from "./approvals.js";
import { batchesPage, batchPage } from "./batches.js";
import { opsPage, costsPage } from "./ops.js";

const routes = [
  [/^\/sessions$/, "sessions", (m, q) => sessionsPage(q)],
  [/^\/sessions\/([^/]+)$/, "sessions", (m) => sessionPage(decodeURIComponent(m[1]))],
  [/^\/approvals$/, "approvals", (m, q) => approvalsPage(q)],
  [/^\/batches$/, "batches", (m, q) => batchesPage(q)],
  [/^\/batches\/([^/]+)$/, "batches", (m) => batchPage(decodeURIComponent(m[1]))],
  [/^\/ops$/, "ops", () => opsPage()],
  [/^\/costs$/, "costs", () => costsPage()],
];

let stop = () => {};
let moved = false;

function route() {
  const hash = location.hash.replace(/^#/, "") || "/sessions";
  const [path, qs] = hash.split("?", 2);
  const query = new URLSearchParams(qs || "");
  const main = document.getElementById("main");
  stop();
  stop = () => {};
  clear(main);
  for (const [re, page, render] of routes) {
    const m = path.match(re);
    if (!m) continue;
    for (const a of document.querySelectorAll("#nav a")) {
      if (a.dataset.page === page) a.setAttribute("aria-current", "page");
      else a.removeAttribute("aria-current");
    }
    const ctl = new AbortController();
    stop = () => ctl.abort();
    Promise.resolve(render(m, query, ctl.signal)).then((view) => {
      if (ctl.signal.aborted) {
        view?.stop?.();
        return;
      }
      clear(main);
      main.append(view.el);
      // After a move between pages, a keyboard or screen reader user starts at the new
      // page's content (the first load keeps the browser's own start, the skip link).
      if (moved) main.focus({ preventScroll: true });
      moved = true;
      stop = () => { ctl.abort(); view.stop?.(); };
      if (view.title) document.title = `${view.title} · agentq console`;
    }).catch((e) => {
      clear(main);
      main.append(h("p", { class: "notice error", role: "alert" }, `Cannot show this page: ${e.message}`));
    });
    return;
  }
  main.append(h("p", { class: "notice error", role: "alert" }, "No such page."));
}

/** Go to `path` with `query` (kept in the URL). */
export function navigate(path, query) {
  const qs = query ? new URLSearchParams(query).toString() : "";
  location.hash = qs ? `${path}?${qs}` : path;
}

function init() {
  const form = document.getElementById("key-form");
  const input = document.getElementById("key-input");
  const needed = document.getElementById("key-needed");
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    setKey(input.value.trim());
    input.value = "";
    needed.hidden = true;
    route();
  });
  document.getElementById("key-forget").addEventListener("click", () => {
    setKey("");
    route();
  });
  const showKeyState = () => {
    input.placeholder = getKey() ? "a key is in use (this tab only)" : "aq_… (none on a local agentq dev)";
  };
  window.addEventListener("agentq-key", showKeyState);
  window.addEventListener("agentq-unauthorized", () => { needed.hidden = false; });
  showKeyState();
  window.addEventListener("hashchange", route);
  route();
}

init();
