// The console in a real browser (headless Chromium driven by playwright-core) against a
// real `agentq dev` on the scripted model; started by cli/tests/console.rs.
//
//   node console.mjs <api url> <admin key> <screenshot dir>
//
// Every wait is for an element or a state (a hang guard bounds each); nothing waits on
// the wall clock. Hostile text (markup, `</script>`) is put into a prompt, metadata, a tool
// result and a file name, and the page must never run it: `window.__pwned` stays unset and
// the page reports no Content-Security-Policy violation and no script error.

import { chromium } from "playwright-core";
import { mkdirSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, key, shots] = process.argv.slice(2);
const HOSTILE = `<img src=x onerror="window.__pwned=1"></script><script>window.__pwned=2</script>`;
const GUARD = 45_000;

function fail(msg) {
  throw new Error(msg);
}

async function call(method, path, body) {
  const resp = await fetch(url + path, {
    method,
    headers: { Authorization: `Bearer ${key}`, "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await resp.text();
  if (!resp.ok) fail(`${method} ${path}: ${resp.status} ${text}`);
  return text ? JSON.parse(text) : null;
}

/** Poll `check` until it gives a truthy value (a hang guard bounds it). */
async function until(what, check, limit = GUARD) {
  const end = Date.now() + limit;
  let last;
  for (;;) {
    last = await check();
    if (last) return last;
    if (Date.now() > end) fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

const step = (name) => console.log(`console.mjs: ${name}`);

// Every control on the page has an accessible name: a label, aria-label or its text.
async function checkLabels(page, where) {
  const unnamed = await page.evaluate(() => {
    const bad = [];
    for (const el of document.querySelectorAll("a, button, input, select, textarea, summary")) {
      if (el.closest("[hidden]") || el.type === "hidden") continue;
      const label = el.getAttribute("aria-label") ||
        (el.labels && [...el.labels].map((l) => l.textContent).join(" ")) ||
        (["A", "BUTTON", "SUMMARY"].includes(el.tagName) ? el.textContent : "");
      if (!label || !label.trim()) bad.push(el.outerHTML.slice(0, 120));
    }
    return bad;
  });
  if (unnamed.length) fail(`${where}: controls without an accessible name: ${unnamed.join(" | ")}`);
}

async function checkSafe(page, where) {
  const state = await page.evaluate(() => ({ pwned: window.__pwned ?? null, csp: window.__csp || [] }));
  if (state.pwned !== null) fail(`${where}: hostile markup ran (window.__pwned = ${state.pwned})`);
  if (state.csp.length) fail(`${where}: Content-Security-Policy violations: ${state.csp.join(", ")}`);
}

async function noHorizontalScroll(page, where) {
  const over = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  if (over > 1) fail(`${where}: the page is ${over}px wider than a 390px window`);
}

async function main() {
  mkdirSync(shots, { recursive: true });
  // The sessions, over the API (the console shows and steers them; it does not create them).
  const held = await call("POST", "/v1/sessions", {
    prompt: "hold: write the report", tools: ["write_file"], sensitive_tools: ["write_file"],
  });
  const failing = await call("POST", "/v1/sessions", { prompt: "fail: this one fails first" });
  // A second one for the bulk retry (the first recovers on its own retry).
  const failingToo = await call("POST", "/v1/sessions", { prompt: "fail: this one fails too" });
  const parent = await call("POST", "/v1/sessions", { prompt: "parent: ask a helper", tools: ["spawn_agent"] });
  for (let i = 0; i < 4; i++) await call("POST", "/v1/sessions", { prompt: `filler ${i}` });
  const batch = await call("POST", "/v1/batches", {
    requests: [1, 2, 3].map((i) => ({ custom_id: `item-${i}`, prompt: `filler batch ${i}` })),
  });

  const browser = await chromium.launch({
    executablePath: process.env.AGENTQ_CHROMIUM || "/usr/bin/chromium",
    args: ["--no-sandbox", "--disable-dev-shm-usage"],
  });
  const errors = [];
  try {
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 }, acceptDownloads: true });
    await context.addInitScript(() => {
      window.__csp = [];
      document.addEventListener("securitypolicyviolation", (e) => {
        window.__csp.push(`${e.violatedDirective} ${e.blockedURI}`);
      });
    });
    const page = await context.newPage();
    page.on("pageerror", (e) => errors.push(String(e)));
    page.setDefaultTimeout(GUARD);

    step("the key: the page asks for one, and it is kept in the tab only");
    await page.goto(`${url}/console`);
    await page.getByText("This server needs an API key").waitFor();
    await page.getByLabel("API key").fill(key);
    await page.getByRole("button", { name: "Use key" }).click();
    await page.locator("table.list tbody tr[data-id]").first().waitFor();
    if (page.url().includes(key)) fail("the key is in the URL");
    // The live counts of the filter (every session here).
    await page.locator(".counts .total", { hasText: /^\d+ matching$/ }).waitFor();
    await checkLabels(page, "sessions");
    await page.screenshot({ path: join(shots, "sessions.png"), fullPage: true });

    step("the search finds a session by a word of its prompt, and the counts follow");
    await page.getByLabel("Search (id or prompt)").fill("HELPER");
    await page.getByRole("button", { name: "Apply filters" }).click();
    await page.locator(".counts .total", { hasText: "1 matching" }).waitFor();
    await page.locator(`tr[data-id="${parent.id}"]`).waitFor();
    if (!page.url().includes("q=HELPER")) fail(`the search is not in the URL: ${page.url()}`);
    if ((await page.locator("table.list tbody tr[data-id]").count()) !== 1) fail("the search shows other sessions");
    // A `%` is matched as itself: no prompt here holds one.
    await page.goto(`${url}/console#/sessions?q=${encodeURIComponent("%")}`);
    await page.getByText("No session matches.").waitFor();
    await page.locator(".counts .total", { hasText: "0 matching" }).waitFor();
    await page.screenshot({ path: join(shots, "sessions-search.png"), fullPage: true });

    step("a live answer arrives on the session's page");
    const live = await call("POST", "/v1/sessions", {
      prompt: `live: answer slowly ${HOSTILE}`, metadata: { note: HOSTILE }, tools: ["write_file"],
    });
    await page.goto(`${url}/console#/sessions/${live.id}`);
    await page.locator(".answer", { hasText: "The answer is 42" }).waitFor();
    await page.getByText("Finished: stop").waitFor();
    // The hostile prompt and metadata are shown as text.
    await page.locator("pre", { hasText: "onerror" }).first().waitFor();
    // Its file's hostile name is shown as text.
    await page.locator("ul.files li", { hasText: "onerror" }).waitFor();
    await checkSafe(page, "live session");
    await checkLabels(page, "session");
    await page.screenshot({ path: join(shots, "session.png"), fullPage: true });

    step("a step is forked: the fork opens, from the session it was forked from");
    await page.getByRole("button", { name: "Fork from step 1" }).click();
    await until("the fork's page", async () =>
      page.url().includes("#/sessions/") && !page.url().includes(live.id));
    const forkId = decodeURIComponent(page.url().split("#/sessions/")[1]);
    await page.getByRole("link", { name: live.id }).first().waitFor();
    const forked = await call("GET", `/v1/sessions/${forkId}`);
    if (forked.forked_from !== live.id || forked.iterations !== 1) {
      fail(`the fork: ${JSON.stringify(forked)}`);
    }
    await page.goto(`${url}/console#/sessions/${live.id}`);
    await page.getByText("Finished: stop").waitFor();

    step("a follow-up message reopens it, and its new turn streams into the same transcript");
    await page.getByLabel("Message", { exact: true }).fill("one more thing");
    await page.getByRole("button", { name: "Send message" }).click();
    await page.getByText("Message taken (follow_up)").waitFor();
    await page.locator(".answer", { hasText: "the script has no more turns" }).waitFor();
    await until("the second finish", async () => (await page.getByText("Finished: stop").count()) === 2);

    step("a dropped event stream resumes with Last-Event-ID: nothing lost, nothing twice");
    const resumed = await page.evaluate(async (id) => {
      const { follow } = await import("/console/sse.js");
      const path = `/v1/sessions/${id}/events`;
      const whole = [];
      await follow(path, { signal: new AbortController().signal, onEvent: (e) => whole.push(e.id) });
      const real = window.fetch;
      const lastIds = [];
      window.fetch = async (input, init) => {
        const resp = await real(input, init);
        lastIds.push(init.headers["Last-Event-ID"] ?? null);
        if (lastIds.length > 1) return resp;
        // The first answer breaks halfway through its first piece.
        const reader = resp.body.getReader();
        const { value } = await reader.read();
        reader.cancel();
        let sent = false;
        const body = new ReadableStream({
          pull(c) {
            if (sent) { c.error(new TypeError("connection reset")); return; }
            sent = true;
            c.enqueue(value.slice(0, Math.floor(value.length / 2)));
          },
        });
        return new Response(body, { status: 200, headers: resp.headers });
      };
      const got = [];
      try {
        await follow(path, { signal: new AbortController().signal, onEvent: (e) => got.push(e.id) });
      } finally {
        window.fetch = real;
      }
      return { whole, got, lastIds };
    }, live.id);
    if (resumed.lastIds.length < 2) fail(`the stream was not resumed: ${JSON.stringify(resumed)}`);
    if (resumed.lastIds[1] === null && resumed.got.length > 0 && resumed.got[0] !== resumed.whole[0]) {
      fail(`resumed without Last-Event-ID: ${JSON.stringify(resumed)}`);
    }
    if (JSON.stringify(resumed.got) !== JSON.stringify(resumed.whole)) {
      fail(`a resumed stream differs from a whole one: ${JSON.stringify(resumed)}`);
    }

    step("a transcript of 2,000 iterations is built step by step, long values collapsed");
    const big = await page.evaluate(async () => {
      const { Transcript } = await import("/console/transcript.js");
      const t = new Transcript();
      document.getElementById("main").append(t.el);
      const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r)));
      t.push({ event: "iteration_started", data: { iteration: 0, seq: 0 } });
      await frame();
      const first = t.el.firstElementChild;
      for (let i = 1; i <= 2000; i++) {
        const seq = 2 * i;
        t.push({ event: "iteration_started", data: { iteration: i, seq } });
        t.push({ event: "text_delta", data: { text: "thinking about it ", seq } });
        t.push({ event: "tool_call", data: { id: `c${i}`, name: "grep", arguments: { q: "y".repeat(1000) }, seq } });
        t.push({ event: "tool_result", data: { id: `c${i}`, name: "grep", content: "z".repeat(5000), is_error: false, seq: seq + 1 } });
        t.push({ event: "iteration_completed", data: { iteration: i, usage: { input_tokens: 1, output_tokens: 1 }, seq } });
      }
      await frame();
      document.scrollingElement.scrollTop = 0;
      await frame();
      const result = {
        same: t.el.firstElementChild === first,
        steps: t.el.children.length,
        collapsed: t.el.querySelectorAll("details.collapsed").length,
        loaded: t.el.textContent.includes("z".repeat(5000)),
      };
      t.el.remove();
      return result;
    });
    if (!big.same || big.steps !== 2001 || big.collapsed !== 4000 || big.loaded) {
      fail(`the long transcript: ${JSON.stringify(big)}`);
    }

    step("a filter finds the failed session, and it is retried");
    await page.goto(`${url}/console#/sessions`);
    await page.getByLabel("Status").selectOption("failed");
    // The view is built anew for the filter, its list fetched first: until then the page
    // still shows the list it had, every status in it, under the filter's URL already.
    const unfiltered = await page.locator("table.list").elementHandle();
    await page.getByRole("button", { name: "Apply filters" }).click();
    await page.waitForFunction((table) => !table.isConnected, unfiltered);
    await until("the failed session in the filtered list", async () => {
      if (!page.url().includes("status=failed")) return false;
      if (await page.locator(`tr[data-id="${failing.id}"]`).count()) return true;
      await page.reload();
      await page.locator("table.list tbody tr").first().waitFor();
      return false;
    });
    if (await page.locator(`tr[data-id="${live.id}"]`).count()) fail("the status filter shows a completed session");
    await page.screenshot({ path: join(shots, "sessions-failed.png"), fullPage: true });
    await page.getByRole("link", { name: `Session ${failing.id}` }).click();
    await page.getByRole("button", { name: "Retry session" }).click();
    await page.getByText("Retry: now queued").waitFor();
    // The scripted refusal plays once per session, whichever of dev's workers runs the
    // retry: it recovers.
    await until("the retried session to recover", async () => {
      const s = await call("GET", `/v1/sessions/${failing.id}`);
      return s.status === "completed" && s.result === "recovered on the retry";
    });
    // Every failed session the filter selects is retried at once (the button asks for a
    // second click first).
    await page.goto(`${url}/console#/sessions?status=failed`);
    await until("the other failed session", async () => {
      await page.reload();
      await page.locator("table.list tbody tr").first().waitFor();
      return (await page.locator(`tr[data-id="${failingToo.id}"]`).count()) > 0;
    });
    await page.getByRole("button", { name: "Retry failed matching" }).click();
    await page.getByRole("button", { name: "Confirm: retry failed matching" }).click();
    await page.getByText(/^Retried: [1-9]\d* session\(s\)\.$/).waitFor();
    await until("the bulk-retried session to recover", async () => {
      const s = await call("GET", `/v1/sessions/${failingToo.id}`);
      return s.status === "completed" && s.result === "recovered on the retry";
    });

    step("a held call is approved from the inbox and the session finishes");
    await page.goto(`${url}/console#/approvals`);
    const approve = page.locator(".inbox-item")
      .filter({ has: page.getByRole("link", { name: `Session ${held.id}` }) })
      .getByRole("button", { name: /^Approve write_file call / });
    await until("the held call in the inbox", async () => {
      if (await approve.count()) return true;
      await page.reload();
      await page.getByRole("heading", { name: "Approvals" }).waitFor();
      return false;
    });
    await checkLabels(page, "approvals");
    await page.screenshot({ path: join(shots, "approvals.png"), fullPage: true });
    await approve.first().click();
    await page.getByText(/^Approved write_file/).waitFor();
    await page.goto(`${url}/console#/sessions/${held.id}`);
    await page.locator(".facts .badge", { hasText: "completed" }).waitFor();

    step("its file is downloaded (fetched with the key) and previewed as text");
    const fileName = "report.txt";
    const dl = page.waitForEvent("download");
    await page.getByRole("button", { name: `Download ${fileName}` }).click();
    const download = await dl;
    const saved = join(mkdtempSync(join(tmpdir(), "agentq-console-")), fileName);
    await download.saveAs(saved);
    const content = readFileSync(saved, "utf8");
    if (!content.includes("report body")) fail(`downloaded ${JSON.stringify(content)}`);
    if (download.url().includes(key)) fail("the download's URL carries the key");
    await page.getByRole("button", { name: `Preview ${fileName}` }).click();
    await page.locator(".preview pre", { hasText: "report body" }).waitFor();
    // The tool result that came back holds the hostile text too.
    await checkSafe(page, "held session");

    const doc = await (await fetch(`${url}/openapi.json`)).json();
    if (doc.components.schemas.ApprovalRequest.properties.arguments) {
      step("a held call approved with edited arguments");
      const edit = await call("POST", "/v1/sessions", {
        prompt: "hold: edit me", tools: ["write_file"], sensitive_tools: ["write_file"],
      });
      await page.goto(`${url}/console#/sessions/${edit.id}`);
      await page.getByText("Approve with edited arguments").click();
      await page.getByLabel("Arguments (JSON)").fill(JSON.stringify({ path: "report.txt", content: "edited body" }));
      await page.getByRole("button", { name: /with edited arguments$/ }).click();
      await page.locator(".facts .badge", { hasText: "completed" }).waitFor();
      await page.getByRole("button", { name: "Preview report.txt" }).click();
      await page.locator(".preview pre", { hasText: "edited body" }).waitFor();
    } else {
      step("skipped: this server takes no edited arguments (ApprovalRequest has no `arguments`)");
    }

    step("the tree of a parent links to its child");
    await page.goto(`${url}/console#/sessions/${parent.id}`);
    const child = page.locator("ul.tree a").first();
    await until("the child in the tree", async () => {
      if (await child.count()) return true;
      await page.reload();
      await page.locator("h1").waitFor();
      return false;
    });
    await child.click();
    await until("the child's page", async () => !page.url().endsWith(parent.id) && page.url().includes("#/sessions/"));
    await page.locator(".facts dt", { hasText: "Parent" }).waitFor();

    step("batches, operations and costs");
    await page.goto(`${url}/console#/batches`);
    await page.getByRole("link", { name: `Batch ${batch.id}` }).waitFor();
    await checkLabels(page, "batches");
    await page.screenshot({ path: join(shots, "batches.png"), fullPage: true });
    await page.getByRole("link", { name: `Batch ${batch.id}` }).click();
    await page.getByRole("button", { name: "Download results (JSON Lines)" }).waitFor();
    // A session that runs for as long as the test does: a worker holds its lease.
    const slow = await call("POST", "/v1/sessions", { prompt: "slow: take your time" });
    await until("the slow session to run", async () => (await call("GET", `/v1/sessions/${slow.id}`)).status === "running");
    await page.goto(`${url}/console#/ops`);
    await page.getByRole("heading", { name: "Rate limiter" }).waitFor();
    await page.getByRole("heading", { name: "Budgets" }).waitFor();
    const queueRow = page.locator("section[aria-labelledby=q-h] tbody tr", { hasText: "default" });
    await queueRow.waitFor();
    const queueCells = await queueRow.locator("td").allTextContents();
    if (!/^\d+$/.test(queueCells[1]) || !/^\d+$/.test(queueCells[2]) || !/^\d+$/.test(queueCells[3])) {
      fail(`the default queue's length, pending and held: ${JSON.stringify(queueCells)}`);
    }
    const workerRow = page.locator("section[aria-labelledby=wk-h] tbody tr").first();
    const workerCells = await workerRow.locator("td").allTextContents();
    if (workerCells.length !== 4 || !/^[1-9]\d*$/.test(workerCells[1])) {
      fail(`a worker holding the slow session's lease: ${JSON.stringify(workerCells)}`);
    }
    await page.locator("section[aria-labelledby=w-h] tbody tr", { hasText: "waiting for approval" }).waitFor();
    await checkLabels(page, "operations");
    await page.screenshot({ path: join(shots, "ops.png"), fullPage: true });
    await page.goto(`${url}/console#/costs`);
    // The scripted model's row (every session here ran on it).
    await page.locator("section[aria-labelledby=c-h] tbody tr", { hasText: "scripted" }).first().waitFor();
    await page.getByRole("textbox", { name: "Tenant" }).fill("default");
    await page.getByRole("button", { name: "Show spend" }).click();
    await page.getByText("Spend of default").waitFor();
    await checkLabels(page, "costs");
    await page.screenshot({ path: join(shots, "costs.png"), fullPage: true });

    step("keyboard: the skip link, the navigation and a session link by Tab and Enter");
    await page.goto(`${url}/console#/sessions`);
    await page.reload();
    await page.locator("table.list tbody tr[data-id]").first().waitFor();
    await page.keyboard.press("Tab");
    const first = await page.evaluate(() => document.activeElement.textContent);
    if (first !== "Skip to content") fail(`the first Tab reached ${JSON.stringify(first)}`);
    await until("Tab to reach the Approvals link", async () => {
      await page.keyboard.press("Tab");
      return page.evaluate(() => document.activeElement.textContent === "Approvals");
    });
    await page.keyboard.press("Enter");
    await page.getByRole("heading", { name: "Approvals" }).waitFor();
    await page.goto(`${url}/console#/sessions`);
    await page.locator("table.list tbody tr[data-id]").first().waitFor();
    await page.getByRole("link", { name: `Session ${live.id}` }).focus();
    await page.keyboard.press("Enter");
    await page.getByText("Finished: stop").first().waitFor();

    step("a narrow window (390 px)");
    await page.setViewportSize({ width: 390, height: 844 });
    await page.goto(`${url}/console#/sessions`);
    await page.locator("table.list tbody tr[data-id]").first().waitFor();
    await noHorizontalScroll(page, "sessions");
    await page.screenshot({ path: join(shots, "narrow-sessions.png"), fullPage: true });
    await page.goto(`${url}/console#/sessions/${held.id}`);
    await page.getByRole("heading", { name: /^Files/ }).waitFor();
    await noHorizontalScroll(page, "session");
    await page.screenshot({ path: join(shots, "narrow-session.png"), fullPage: false });
    await checkSafe(page, "the end");
    if (errors.length) fail(`script errors on the page: ${errors.join(" | ")}`);
  } finally {
    await browser.close();
  }
  step("ok");
}

main().catch((e) => {
  console.error(`console.mjs: FAILED: ${e.stack || e}`);
  process.exit(1);
});
