// The console's shell: the sidebar, the key field, the notice line and the router. Each page is a module
// under pages/ with a stable address (/#/steering); a page's render() returns a function that stops its timers.

import { ApiError, getKey, setKey } from "./api.js";
import { fill, h } from "./dom.js";
import * as compare from "./pages/compare.js";
import * as dashboard from "./pages/dashboard.js";
import * as documents from "./pages/documents.js";
import * as feature from "./pages/feature.js";
import * as models from "./pages/models.js";
import * as monitor from "./pages/monitor.js";
import * as playground from "./pages/playground.js";
import * as saes from "./pages/saes.js";
import * as steering from "./pages/steering.js";
import * as sweeps from "./pages/sweeps.js";
import * as vectors from "./pages/vectors.js";

export const PAGES = [
  ["dashboard", "Dashboard", dashboard],
  ["models", "Models", models],
  ["saes", "SAEs", saes],
  ["vectors", "Vectors", vectors],
  ["steering", "Steering", steering],
  ["monitor", "Monitor", monitor],
  ["profiles", "Profiles", documents.profiles],
  ["clusters", "Clusters", documents.clusters],
  ["circuits", "Circuits", documents.circuits],
  ["playground", "Playground", playground],
  ["compare", "Compare", compare],
  ["sweeps", "Sweeps", sweeps],
  ["features", "Features", feature],
];

const notice = document.getElementById("notice");
let stop = null;

/** Show a message (a refusal verbatim, or what happened) on the notice line. */
export function say(message, kind = "info") {
  notice.hidden = false;
  notice.className = kind;
  notice.textContent = message;
}

/** Show an error: a server's refusal with its status and code, anything else as its message. */
export function fail(err) {
  say(err instanceof ApiError ? err.describe() : String(err && err.message ? err.message : err), "error");
  if (err instanceof ApiError && err.status === 401) document.getElementById("key").focus(); // the page asks for it
}

function quiet() {
  notice.hidden = true;
  notice.textContent = "";
}

/** Run an action; a refusal lands on the notice line instead of escaping. */
export async function attempt(action, done) {
  try {
    const result = await action();
    if (done) say(typeof done === "function" ? done(result) : done);
    return result;
  } catch (err) {
    fail(err);
    return undefined;
  }
}

const ctx = { say, fail, attempt, go: (page) => { location.hash = `#/${page}`; } };

/** The address after the #: the page, the path segments after it and the query (``#/features/SAE/12?x=1``). */
export function address(hash = location.hash) {
  const rest = hash.replace(/^#\/?/, "");
  const at = rest.indexOf("?");
  const [path, search] = at < 0 ? [rest, ""] : [rest.slice(0, at), rest.slice(at + 1)];
  const [name, ...parts] = path.split("/").map((p) => decodeURIComponent(p));
  return { name: name || "dashboard", parts, query: new URLSearchParams(search) };
}

function current() {
  const name = address().name;
  return PAGES.find(([id]) => id === name) || PAGES[0];
}

async function route() {
  if (stop) stop();
  stop = null;
  quiet();
  const [id, title, page] = current();
  document.getElementById("title").textContent = title;
  document.title = `${title} · miLLM`;
  for (const link of document.querySelectorAll("#nav a")) {
    link.classList.toggle("active", link.dataset.page === id);
  }
  const root = fill(document.getElementById("page"));
  root.dataset.page = id;
  try {
    stop = (await page.render(root, ctx, address())) || null;
  } catch (err) {
    fail(err);
  }
}

function keyState() {
  document.getElementById("key-state").textContent = getKey() ? "key set for this tab" : "no key";
}

function setup() {
  fill(document.getElementById("nav"),
    PAGES.map(([id, title]) => h("li", null, h("a", { href: `#/${id}`, "data-page": id }, title))));
  document.getElementById("keyform").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("key");
    setKey(input.value.trim());
    input.value = "";
    keyState();
    route();
  });
  document.getElementById("key-forget").addEventListener("click", () => {
    setKey("");
    keyState();
    route();
  });
  keyState();
  window.addEventListener("hashchange", route);
  route();
}

setup();
