// The console's only way to the server: same-origin fetch() to the public /api and /v1 routes.
// Bodies are JSON sent as application/json (the server refuses anything else from a browser); the key, when
// the operator gives one, lives in this tab's sessionStorage and travels only in the Authorization header.

const KEY_SLOT = "millm.key";

/** A refusal from the server: its HTTP status, its error code and its message, verbatim. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }

  /** The refusal as the page shows it: status, code and the server's own message. */
  describe() {
    const hint = this.status === 401 ? " (enter the key above)" : "";
    return `${this.status} ${this.code}: ${this.message}${hint}`;
  }
}

export function getKey() {
  return sessionStorage.getItem(KEY_SLOT) || "";
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY_SLOT, key);
  else sessionStorage.removeItem(KEY_SLOT);
}

/** The headers a request carries: the key if one is set, the JSON type when there is a body. */
export function headers(withBody) {
  const out = {};
  const key = getKey();
  if (key) out.Authorization = `Bearer ${key}`;
  if (withBody) out["Content-Type"] = "application/json";
  return out;
}

/** Send a request; resolve to the parsed JSON answer (or text), reject with an ApiError on a refusal. */
export async function request(method, path, body) {
  const init = { method, headers: headers(body !== undefined), credentials: "same-origin", cache: "no-store" };
  if (body !== undefined) init.body = JSON.stringify(body);
  let response;
  try {
    response = await fetch(path, init);
  } catch (err) {
    throw new ApiError(0, "unreachable", `The server did not answer (${err.message}).`);
  }
  return read(response);
}

/** A response's body, or its refusal as an ApiError. */
export async function read(response) {
  const text = await response.text();
  let data = text;
  if ((response.headers.get("Content-Type") || "").includes("json")) {
    try { data = JSON.parse(text); } catch { data = text; }
  }
  if (!response.ok) {
    const error = (data && typeof data === "object" && data.error) || {};
    throw new ApiError(response.status, error.code || response.statusText || "error",
                       error.message || String(text).slice(0, 500));
  }
  return data;
}

/** The server-sent events of ``response``'s body as they arrive: {event, data}, data as sent (text). */
export async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    const frames = buffer.split("\n\n");
    buffer = frames.pop();
    for (const frame of frames) {
      const lines = frame.split("\n");
      const name = lines.find((l) => l.startsWith("event:"));
      const data = lines.filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("\n");
      if (data) yield { event: name ? name.slice(6).trim() : "message", data };
    }
  }
}

/** A GET route's event stream (fetch, not EventSource, so the key travels in its header, never the URL). */
export async function subscribe(path, signal) {
  const response = await fetch(path, { headers: headers(false), credentials: "same-origin", cache: "no-store",
                                       signal });
  if (!response.ok) await read(response); // throws the refusal
  return events(response);
}

export const get = (path) => request("GET", path);
export const post = (path, body) => request("POST", path, body);
export const put = (path, body) => request("PUT", path, body);
export const patch = (path, body) => request("PATCH", path, body);
export const del = (path) => request("DELETE", path);

/** A path segment, escaped (ids, names). */
export const seg = (value) => encodeURIComponent(String(value));
