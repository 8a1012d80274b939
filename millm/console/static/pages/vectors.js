// Vectors: stored steering-vector sets (attach at a layer, detach, export as a llama.cpp control vector,
// delete), learning a set from concept words, example texts or example files (picked here, read by the server
// as `millm vectors learn` reads one) as a background job whose progress the page
// follows, and importing a set or control-vector file by path. Attached sets steer from the Steering page.

import { del, get, headers, post, read, seg } from "../api.js";
import { field, fill, h, section, table } from "../dom.js";
import { failure, follow } from "../jobs.js";

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
  const error = failure(job);
  return `${job.id} ${job.name}: ${job.status}${shown ? ` (${shown})` : ""}${error ? ` — ${error}` : ""}`;
}

/** A picked file as the learn route takes it ({name, text}); the server reads it as the CLI reads a file. */
async function upload(input) {
  const file = input.files && input.files[0];
  return file ? { name: file.name, text: await file.text() } : null;
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
  const positiveFile = h("input", { id: "learn-positive-file", type: "file", accept: ".txt,.jsonl,text/plain" });
  const negativeFile = h("input", { id: "learn-negative-file", type: "file", accept: ".txt,.jsonl,text/plain" });
  const importPath = h("input", { id: "vector-path", placeholder: "/path/to/set folder or control.gguf", size: 36 });
  const importName = h("input", { id: "vector-import-name", placeholder: "name" });
  let stopFollowing = () => {};

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

  async function learn() {
    const body = { name: name.value.trim(), method: method.value };
    const at = layerOf(layer.value);
    if (at !== undefined) body.layer = at;
    if (concepts.value.trim()) body.concepts = concepts.value.split(",").map((c) => c.trim()).filter(Boolean);
    else {
      for (const [side, texts, file] of [["positive", positive, positiveFile], ["negative", negative, negativeFile]]) {
        const picked = await upload(file);
        if (picked) body[`${side}_file`] = picked;
        else body[side] = lines(texts.value);
      }
    }
    const started = await ctx.attempt(() => post("/api/vectors/learn", body),
      (j) => `Learning ${j.name}: job ${j.id}.`);
    if (started) {
      job.textContent = progressText(started);
      job.dataset.status = started.status;
      stopFollowing();
      stopFollowing = follow(`/api/vectors/jobs/${seg(started.id)}`, {
        show: (now) => { job.textContent = progressText(now); job.dataset.status = now.status; },
        ended: () => refresh(),
        fail: ctx.fail,
      });
    }
  }

  root.append(
    section("Vector sets", list),
    section("Learn a set",
      h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); learn(); } },
        field("name", name), field("layer", layer), field("method", method),
        field("concepts (the model writes examples)", concepts),
        field("or positive texts", positive), field("and negative texts", negative),
        field("or a positive file (lines or JSONL chats)", positiveFile), field("and a negative file", negativeFile),
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
  return () => stopFollowing();
}
