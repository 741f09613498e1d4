// The only way the console talks to agentq: the public HTTP API on this origin, with the
// key the person typed (kept in sessionStorage, so it dies with the tab and never appears
// in a URL), or no key on a keyless `agentq dev`.

const KEY = "agentq.key";

export function getKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setKey(k) {
  if (k) sessionStorage.setItem(KEY, k);
  else sessionStorage.removeItem(KEY);
  window.dispatchEvent(new Event("agentq-key"));
}

export function authHeaders(extra = {}) {
  const headers = { ...extra };
  const k = getKey();
  if (k) headers.Authorization = `Bearer ${k}`;
  return headers;
}

export class ApiError extends Error {
  constructor(status, body) {
    const detail = body && body.error ? body.error : null;
    const field = detail && detail.field ? ` (${detail.field})` : "";
    super(detail ? `${detail.message}${field}` : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

/** `path` with `query` (an object or URLSearchParams; empty values left out). */
export function withQuery(path, query) {
  if (!query) return path;
  const q = new URLSearchParams();
  const entries = query instanceof URLSearchParams ? query.entries() : Object.entries(query);
  for (const [k, v] of entries) {
    if (Array.isArray(v)) v.forEach((x) => x !== "" && q.append(k, x));
    else if (v !== undefined && v !== null && v !== "") q.append(k, v);
  }
  const s = q.toString();
  return s ? `${path}?${s}` : path;
}

/** Call the API: the JSON answer, or an ApiError. A write always sends JSON (a keyless
 * server takes nothing else from a browser). */
export async function api(path, { method = "GET", body, query, signal } = {}) {
  const init = { method, signal, headers: authHeaders({ Accept: "application/json" }) };
  if (method !== "GET") {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body ?? {});
  }
  const resp = await fetch(withQuery(path, query), init);
  const text = await resp.text();
  let json = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {
    json = null;
  }
  if (resp.status === 401) window.dispatchEvent(new Event("agentq-unauthorized"));
  if (!resp.ok) throw new ApiError(resp.status, json);
  return json;
}

/** The bytes at `path` (fetched with the key) as a Blob. */
export async function blob(path, { signal } = {}) {
  const resp = await fetch(path, { headers: authHeaders(), signal });
  if (!resp.ok) {
    let json = null;
    try { json = await resp.json(); } catch { json = null; }
    throw new ApiError(resp.status, json);
  }
  return resp.blob();
}

/** Save the bytes at `path` as `name`: fetched with the key, handed to the browser as a
 * blob URL (a URL carrying the key would land in history and logs). */
export async function download(path, name) {
  const b = await blob(path);
  const url = URL.createObjectURL(b);
  const a = document.createElement("a");
  a.href = url;
  a.download = name.split("/").pop() || "download";
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

let docPromise = null;
/** This server's OpenAPI document (public), read once. */
export function openapi() {
  if (!docPromise) {
    docPromise = fetch("/openapi.json").then((r) => (r.ok ? r.json() : { paths: {} }))
      .catch(() => ({ paths: {} }));
  }
  return docPromise;
}

/** Whether this server serves `method path` (its OpenAPI path). */
export async function serves(method, path) {
  const doc = await openapi();
  return Boolean(doc.paths && doc.paths[path] && doc.paths[path][method.toLowerCase()]);
}

/** The query parameters this server's `GET path` takes. */
export async function queryParams(path) {
  const doc = await openapi();
  const op = doc.paths && doc.paths[path] && doc.paths[path].get;
  return new Set(((op && op.parameters) || []).filter((p) => p.in === "query").map((p) => p.name));
}

/** The properties of a named schema of the document. */
export async function schemaFields(name) {
  const doc = await openapi();
  const s = doc.components && doc.components.schemas && doc.components.schemas[name];
  return new Set(Object.keys((s && s.properties) || {}));
}
