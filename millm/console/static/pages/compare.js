// Compare: one prompt (or several: a grid, prompts down, conditions across) against up to 8 conditions, the same
// seed and sampling for all, every answer streamed at once (on --batching they decode together). A condition is
// "off" (steering_intensity off), "live" (the live values), "profile:NAME", or "SAE#INDEX=STRENGTH" (one feature
// alone, sent as the profile cmp.SAE.INDEX.STRENGTH, saved or updated when the comparison runs). Under each answer:
// its steering header, its prompt-free fluency and distinct-bigram share (POST /api/measure, the sweep measure's
// parts) and "Copy as code". The whole state lives in the address (#/compare?p=...&c=...&seed=...), so a copied
// link opened elsewhere on the same server gives the same answers.

import { get, post, put, seg } from "../api.js";
import { stream } from "../chat.js";
import { codeBlock } from "../code.js";
import { field, fill, h, num, section } from "../dom.js";

export const MOST = 8; // conditions, and prompts, one comparison takes
const FEATURE = /^(.+)#(\d+)=(-?\d+(?:\.\d+)?)$/;

/** A condition line as {label, extra (the request's steering fields), profile (the document it needs)}. */
export function condition(text) {
  const t = text.trim();
  if (t === "off") return { label: t, extra: { steering_intensity: "off" } };
  if (t === "live") return { label: t, extra: {} };
  if (t.startsWith("profile:")) return { label: t, extra: { profile: t.slice(8).trim() } };
  const m = FEATURE.exec(t);
  if (!m) throw new Error(`'${t}' is not a condition: off, live, profile:NAME or SAE#INDEX=STRENGTH.`);
  const [, sae, index, strength] = m;
  const name = `cmp.${sae}.${index}.${strength}`;
  return { label: t, extra: { profile: name }, profile: {
    name, description: `compare: feature ${index} of ${sae} at ${strength}`,
    entries: [{ sae, feature: Number(index), strength: Number(strength) }] } };
}

/** Save (or update) the profile a feature condition runs as. */
export async function saveProfile(doc) {
  try {
    await put(`/api/profiles/${seg(doc.name)}`, { description: doc.description, entries: doc.entries });
  } catch (err) {
    if (err.status !== 404) throw err;
    await post("/api/profiles", doc);
  }
}

/** The form's state as the address's query, and back. */
function toQuery(state) {
  const q = new URLSearchParams();
  for (const p of state.prompts) q.append("p", p);
  for (const c of state.conditions) q.append("c", c);
  for (const k of ["model", "seed", "temperature", "max_tokens"]) if (state[k] !== "") q.set(k, state[k]);
  return q;
}

export async function render(root, ctx, route) {
  const q = route.query;
  const inference = await get("/api/health/inference").catch(() => ({}));
  const prompts = h("textarea", { id: "cmp-prompts", rows: 3, cols: 50, placeholder: "one prompt per line" });
  prompts.value = q.getAll("p").join("\n") || "Tell me about your day.";
  const conditions = h("textarea", { id: "cmp-conditions", rows: 4, cols: 40,
                                     placeholder: "off\nlive\nprofile:NAME\nSAE#INDEX=STRENGTH" });
  conditions.value = q.getAll("c").join("\n") || "off\nlive";
  const model = h("input", { id: "cmp-model", size: 28, value: q.get("model") || inference.model || "" });
  const seed = h("input", { id: "cmp-seed", type: "number", step: 1, value: q.get("seed") ?? 0 });
  const temperature = h("input", { id: "cmp-temperature", type: "number", min: 0, max: 2, step: 0.1,
                                   value: q.get("temperature") ?? 0.7 });
  const maxTokens = h("input", { id: "cmp-max-tokens", type: "number", min: 1, value: q.get("max_tokens") ?? 48 });
  const grid = h("div", { id: "cmp-grid" });
  const link = h("a", { id: "cmp-link", href: "#" }, "link to this comparison");
  let running = null;

  function state() {
    return { prompts: prompts.value.split("\n").map((p) => p.trim()).filter(Boolean),
             conditions: conditions.value.split("\n").map((c) => c.trim()).filter(Boolean),
             model: model.value.trim(), seed: seed.value, temperature: temperature.value, max_tokens: maxTokens.value };
  }

  async function run() {
    const s = state();
    if (!s.prompts.length || s.prompts.length > MOST) throw new Error(`Give 1 to ${MOST} prompts.`);
    if (!s.conditions.length || s.conditions.length > MOST) throw new Error(`Give 1 to ${MOST} conditions.`);
    const parsed = s.conditions.map(condition);
    const address = `#/compare?${toQuery(s)}`;
    history.replaceState(null, "", address); // the link reproduces this run; no re-render
    link.href = address;
    for (const c of parsed) if (c.profile) await saveProfile(c.profile);
    const base = { model: s.model, temperature: Number(s.temperature), max_tokens: Number(s.max_tokens),
                   stream: true };
    if (s.seed !== "") base.seed = Number(s.seed);
    if (running) running.abort();
    running = new AbortController();
    const cells = [];
    fill(grid, s.prompts.map((prompt, i) => h("div", { class: "cmp-row", "data-prompt": i },
      h("h3", null, prompt),
      h("div", { class: "columns" }, parsed.map((c, j) => {
        const body = { ...base, messages: [{ role: "user", content: prompt }], ...c.extra };
        const text = h("div", { class: "text" });
        const header = h("p", { class: "muted steering" });
        const quality = h("p", { class: "muted quality" });
        const column = h("div", { class: "column", "data-condition": j, "data-state": "streaming" },
          h("b", null, c.label), text, header, quality, codeBlock(location.origin, body, c.profile));
        cells.push({ body, text, header, quality, column });
        return column;
      })))));
    const signal = running.signal;
    await Promise.all(cells.map(async (cell) => {
      try {
        const result = await stream(cell.body, (piece) => { cell.text.textContent += piece; }, signal);
        cell.header.textContent = `X-miLLM-Steering: ${result.steering}`;
        cell.column.dataset.state = `done:${result.finish}`;
      } catch (err) {
        cell.column.dataset.state = "failed";
        cell.header.textContent = err.message;
      }
    }));
    const done = cells.filter((c) => c.column.dataset.state.startsWith("done"));
    if (!done.length) return;
    const measured = await post("/api/measure", { answers: done.map((c) => c.text.textContent) });
    done.forEach((cell, k) => {
      const m = measured.data[k];
      cell.quality.textContent = `fluency ${num(m.logprob, 3)} nats/token (no prompt), distinct bigrams `
        + `${num(m.bigrams, 2)}, ${m.tokens} tokens`;
      cell.column.dataset.measured = "yes";
    });
  }

  root.append(
    section("Compare",
      h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); ctx.attempt(run); } },
        field("prompts (several: a grid)", prompts), field("conditions (up to 8)", conditions),
        field("model", model), field("seed", seed), field("temperature", temperature),
        field("max tokens", maxTokens), h("button", { type: "submit", id: "cmp-run" }, "Run")),
      h("p", { class: "muted" }, link)),
    section("Answers", grid));
  return () => running && running.abort();
}
