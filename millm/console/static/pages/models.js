// Models: the registry with each model's state; add by path, pull from the Hugging Face Hub (a background job
// whose bytes the page follows), load, unload, lock, unlock and delete. A refusal (memory with its figures,
// model_busy, a lock, the Hub's) is shown as the server words it.

import { del, get, post, seg } from "../api.js";
import { field, fill, h, section, table } from "../dom.js";
import { failure, follow } from "../jobs.js";

const MB = 1e6;

/** One line for a pull: its id, what it pulls, how far, and how it ended. */
function pullText(job) {
  const mb = (n) => (n / MB).toFixed(1);
  const bytes = job.bytes_total ? ` ${mb(job.bytes_done)} of ${mb(job.bytes_total)} MB` : "";
  const landed = job.result ? ` as ${job.result.model} (${job.result.downloaded.length} file(s) downloaded)` : "";
  const error = failure(job);
  return `${job.id} ${job.model}: ${job.status}${bytes}${landed}${error ? ` — ${error}` : ""}`;
}

const ACTIONS = { READY: ["load", "lock", "delete"], LOADED: ["unload", "lock"] };

export async function render(root, ctx) {
  const list = h("div", { id: "model-list" });
  const path = h("input", { id: "model-path", placeholder: "/path/to/checkpoint or repo.QUANT.gguf", size: 40 });
  const id = h("input", { id: "model-id", placeholder: "id (optional)" });
  const spec = h("input", { id: "pull-model", placeholder: "owner/name or owner/name-GGUF:Q8_0", size: 36 });
  const pullAs = h("input", { id: "pull-id", placeholder: "id (optional)" });
  const revision = h("input", { id: "pull-revision", placeholder: "main" });
  const pulling = h("p", { id: "pull-job", class: "muted" });
  let stopFollowing = () => {};

  function showPull(job) {
    pulling.textContent = pullText(job);
    pulling.dataset.status = job.status;
  }

  async function pull() {
    const body = { model: spec.value.trim() };
    if (pullAs.value.trim()) body.id = pullAs.value.trim();
    if (revision.value.trim()) body.revision = revision.value.trim();
    const started = await ctx.attempt(() => post("/api/pulls", body), (j) => `Pulling ${j.model}: ${j.id}.`);
    if (!started) return;
    showPull(started);
    stopFollowing();
    stopFollowing = follow(`/api/pulls/${seg(started.id)}`, { show: showPull, ended: () => refresh(), fail: ctx.fail });
  }

  async function act(model, action) {
    const url = `/api/models/${seg(model)}`;
    await ctx.attempt(() => (action === "delete" ? del(url) : post(`${url}/${action}`)),
      (m) => (action === "delete" ? `Deleted ${model}.` : `${model}: ${m.state}${m.locked ? ", locked" : ""}.`));
    await refresh().catch(ctx.fail);
  }

  async function refresh() {
    const { data } = await get("/api/models");
    fill(list, table(["model", "engine", "source", "quantization", "state", ""], data.map((m) => {
      const actions = [...(ACTIONS[m.state] || [])].map((a) => (a === "lock" && m.locked ? "unlock" : a));
      return [m.id, m.engine, m.source, m.quantization || "–", `${m.state}${m.locked ? " (locked)" : ""}`,
              h("span", null, actions.map((a) => h("button", { type: "button", class: a === "delete" ? "danger" : "",
                                                               "data-action": a, onclick: () => act(m.id, a) }, a)))];
    }), { id: "models-table" }));
  }

  root.append(
    section("Models on this machine", list,
      h("form", { class: "inline", onsubmit: async (e) => {
        e.preventDefault();
        const body = { path: path.value.trim() };
        if (id.value.trim()) body.id = id.value.trim();
        await ctx.attempt(() => post("/api/models", body), (m) => `Registered ${m.id}.`);
        await refresh().catch(ctx.fail);
      } }, field("add by path", path), field("id", id), h("button", { type: "submit", id: "model-add" }, "Add"))),
    section("Pull from the Hugging Face Hub",
      h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); pull(); } },
        field("repo or repo:QUANT", spec), field("id", pullAs), field("revision", revision),
        h("button", { type: "submit", id: "pull-go" }, "Pull")),
      pulling));
  const recent = (await get("/api/pulls").catch(() => ({ data: [] }))).data[0];
  if (recent) showPull(recent);
  await refresh();
  return () => stopFollowing();
}
