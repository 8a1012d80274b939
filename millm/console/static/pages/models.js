// Models: the registry with each model's state; add by path, load, unload, lock, unlock and delete. A refusal
// (memory with its figures, model_busy, a lock) is shown as the server words it.

import { del, get, post, seg } from "../api.js";
import { field, fill, h, section, table } from "../dom.js";

const ACTIONS = { READY: ["load", "lock", "delete"], LOADED: ["unload", "lock"] };

export async function render(root, ctx) {
  const list = h("div", { id: "model-list" });
  const path = h("input", { id: "model-path", placeholder: "/path/to/checkpoint or repo.QUANT.gguf", size: 40 });
  const id = h("input", { id: "model-id", placeholder: "id (optional)" });

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
    h("p", { class: "muted" }, "Pulling from the HuggingFace Hub is `millm models pull` (the API has no pull route)."));
  await refresh();
  return null;
}
