// Vectors: stored steering-vector sets (attach at a layer, detach, export as a llama.cpp control vector,
// delete), learning a set from concept words or example texts as a background job whose progress the page
// follows, and importing a set or control-vector file by path. Attached sets steer from the Steering page.

import { del, get, headers, post, read, seg } from "../api.js";
import { field, fill, h, section, table } from "../dom.js";

const FOLLOW_MS = 500;
const JOBS_SHOWN = 5;

function lines(text) {
  return String(text).split("\n").map((t) => t.trim()).filter(Boolean);
}

/** "14", "8-12" or "4, 8": what the learn route takes as ``layer`` (left out when empty). */
export function layerOf(text) {
  const t = String(text).trim();
  if (!t) return undefined;
  if (/^\d+$/.test(t)) return Number(t);
  if (t.includes(",")) {
    return t.split(",").map((p) => p.trim()).filter(Boolean).map((p) => (/^\d+$/.test(p) ? Number(p) : p));
  }
  return t;
}

function progressText(job) {
  const p = job.progress;
  const shown = typeof p === "number" ? `${Math.round(p * 100)}%` : p === null || p === undefined ? "" : String(p);
  const e = job.error && typeof job.error === "object" ? job.error.error || job.error : null;
  const error = e ? ` — ${e.code || "error"}: ${e.message || ""}` : job.error ? ` — ${job.error}` : "";
  return `${job.id} ${job.name}: ${job.status}${shown ? ` (${shown})` : ""}${error}`;
}

async function exportSet(name) {
  const response = await fetch(`/api/vectors/${seg(name)}/export`, { headers: headers(false), cache: "no-store" });
  if (!response.ok) await read(response);
  const url = URL.createObjectURL(await response.blob());
  const link = h("a", { href: url, download: `${name}.gguf` });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

export async function render(root, ctx) {
  const list = h("div", { id: "vector-list" });
  const jobs = h("div", { id: "vector-jobs" });
  const job = h("p", { id: "learn-job", class: "muted" });
  const name = h("input", { id: "learn-name", placeholder: "name" });
  const layer = h("input", { id: "learn-layer", placeholder: "default, 14, 8-12", size: 12 });
  const method = h("select", { id: "learn-method" }, h("option", { value: "diffmean" }, "diffmean"),
    h("option", { value: "pca" }, "pca"));
  const concepts = h("input", { id: "learn-concepts", placeholder: "ocean, sea", size: 30 });
  const positive = h("textarea", { id: "learn-positive", rows: 3, cols: 40, placeholder: "one text per line" });
  const negative = h("textarea", { id: "learn-negative", rows: 3, cols: 40, placeholder: "one text per line" });
  const importPath = h("input", { id: "vector-path", placeholder: "/path/to/set folder or control.gguf", size: 36 });
  const importName = h("input", { id: "vector-import-name", placeholder: "name" });
  let timer = null;

  async function refresh() {
    const [{ data }, recent] = await Promise.all([get("/api/vectors"), get("/api/vectors/jobs")]);
    fill(list, data.length ? table(["set", "layer", "method", "model", "attached", ""], data.map((v) => [
      v.name, String(v.layer ?? "–"), v.method || "–", v.model || "–",
      v.attached_layer === null || v.attached_layer === undefined ? "no" : `layer ${v.attached_layer}`,
      h("span", { "data-set": v.name },
        v.attached_layer === null || v.attached_layer === undefined
          ? h("button", { type: "button", "data-action": "attach", onclick: () => act(
            post(`/api/vectors/${seg(v.name)}/attach`, {}), `Attached ${v.name}.`) }, "attach")
          : h("button", { type: "button", "data-action": "detach", onclick: () => act(
            post(`/api/vectors/${seg(v.name)}/detach`), `Detached ${v.name}.`) }, "detach"),
        h("button", { type: "button", "data-action": "export", onclick: () => ctx.attempt(() => exportSet(v.name),
          `Exported ${v.name}.gguf.`) }, "export"),
        h("button", { type: "button", class: "danger", "data-action": "delete", onclick: () => act(
          del(`/api/vectors/${seg(v.name)}`), `Deleted ${v.name}.`) }, "delete")),
    ]), { id: "vectors-table" }) : h("p", { class: "muted" }, "No vector set stored."));
    fill(jobs, recent.data.length
      ? h("ul", null, recent.data.slice(0, JOBS_SHOWN).map((j) => h("li", null, progressText(j))))
      : h("p", { class: "muted" }, "No learning job yet."));
  }

  async function act(promise, message) {
    await ctx.attempt(() => promise, message);
    await refresh().catch(ctx.fail);
  }

  function follow(id) {
    clearInterval(timer);
    timer = setInterval(async () => {
      try {
        const now = await get(`/api/vectors/jobs/${seg(id)}`);
        job.textContent = progressText(now);
        job.dataset.status = now.status;
        if (!["queued", "running"].includes(now.status)) {
          clearInterval(timer);
          await refresh();
        }
      } catch (err) {
        clearInterval(timer);
        ctx.fail(err);
      }
    }, FOLLOW_MS);
  }

  async function learn() {
    const body = { name: name.value.trim(), method: method.value };
    const at = layerOf(layer.value);
    if (at !== undefined) body.layer = at;
    if (concepts.value.trim()) body.concepts = concepts.value.split(",").map((c) => c.trim()).filter(Boolean);
    else {
      body.positive = lines(positive.value);
      body.negative = lines(negative.value);
    }
    const started = await ctx.attempt(() => post("/api/vectors/learn", body),
      (j) => `Learning ${j.name}: job ${j.id}.`);
    if (started) {
      job.textContent = progressText(started);
      job.dataset.status = started.status;
      follow(started.id);
    }
  }

  root.append(
    section("Vector sets", list),
    section("Learn a set",
      h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); learn(); } },
        field("name", name), field("layer", layer), field("method", method),
        field("concepts (the model writes examples)", concepts),
        field("or positive texts", positive), field("and negative texts", negative),
        h("button", { type: "submit", id: "learn-go" }, "Learn")),
      job, h("h3", null, "Recent jobs"), jobs),
    section("Import",
      h("form", { class: "inline", onsubmit: (e) => {
        e.preventDefault();
        act(post("/api/vectors/import", { path: importPath.value.trim(), name: importName.value.trim() }),
          "Imported.");
      } }, field("path", importPath), field("name", importName),
      h("button", { type: "submit", id: "vector-import" }, "Import"))));
  await refresh();
  return () => clearInterval(timer);
}
