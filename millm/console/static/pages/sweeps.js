// Sweeps: `millm steer sweep`'s measure as a background job (POST /api/sweeps) on a feature of an attached SAE or
// vector set, followed until it ends, then drawn: concept rate against strength (the target marked), fluency and
// relevance (the fluency bound marked), the recommended strength as a vertical line; a click on a point lists
// that strength's answers beside their prompts. `#/sweeps?sae=ID&feature=N` fills the form (a feature page's
// "sweep this").

import { get, post, seg } from "../api.js";
import { field, fill, h, num, section, table } from "../dom.js";
import { resolve } from "../features.js";
import { failure, follow } from "../jobs.js";
import { figure } from "../plot.js";
import { heldOutLine } from "../research.js";

const JOBS_SHOWN = 8;

function describe(job) {
  const r = job.request;
  const error = failure(job);
  return `${job.id}: feature ${r.feature} of ${r.sae}, ${job.status} (${job.progress})${error ? ` — ${error}` : ""}`;
}

/** A finished sweep: the figure, the numbers, and the answers of the point clicked. */
export function drawSweep(slot, job) {
  const result = job.result;
  const answers = new Map((job.answers || []).map((a) => [a.strength, a.answers]));
  const listing = h("div", { id: "sweep-answers" }, h("p", { class: "muted" }, "Click a point to read its answers."));
  const show = (i) => {
    const strength = result.points[i].strength;
    const texts = answers.get(strength) || [];
    fill(listing, h("h3", null, `Answers at strength ${strength}`),
      h("ol", { "data-strength": strength }, texts.map((t, k) => h("li", null,
        h("span", { class: "muted" }, `${job.prompts[k] || ""} → `), h("span", { class: "answer" }, t)))));
  };
  const rows = result.points.map((p) => [String(p.strength), num(p.rate, 2), num(p.fluency, 2),
    p.inside ? "yes" : "no", num(p.relevance, 2), num(p.degenerate, 2)]);
  const rec = result.recommended_strength ?? null;
  fill(slot,
    h("p", { id: "sweep-summary" }, `feature ${result.feature} (${result.label || "no label"}) on ${result.sae} `
      + `L${result.layer}: ${result.prompts} prompts, ${result.tokens} tokens, seed ${result.seed}; concept words `
      + `${result.words.join(", ")}; recommended strength ${rec ?? "none"}`),
    result.held_out ? h("p", { id: "sweep-held-out", class: "muted" }, heldOutLine(result.held_out)) : null,
    figure(job.figure, show),
    table(["strength", "concept rate", "fluency Δ", "inside bound", "relevance Δ", "degenerate"], rows,
      { id: "sweep-table" }),
    listing);
}

export async function render(root, ctx, route) {
  const query = route.query;
  const sae = h("select", { id: "sweep-sae" });
  const feature = h("input", { id: "sweep-feature", placeholder: "index or label", size: 14,
                               value: query.get("feature") || "" });
  const strengths = h("input", { id: "sweep-strengths", value: query.get("strengths") || "0,20,40,60,80", size: 18 });
  const prompts = h("input", { id: "sweep-prompts", type: "number", min: 1, max: 20, value: query.get("prompts") || 8 });
  const heldOut = h("input", { id: "sweep-held-out", type: "number", min: 1, max: 16,
                               value: query.get("held_out") || 16 });
  const tokens = h("input", { id: "sweep-tokens", type: "number", min: 1, max: 512, value: query.get("tokens") || 48 });
  const seed = h("input", { id: "sweep-seed", type: "number", min: 0, value: query.get("seed") || 0 });
  const concepts = h("input", { id: "sweep-concepts", placeholder: "default: the label's words", size: 22 });
  const scope = h("select", { id: "sweep-scope" }, ["all", "generated", "prompt"].map(
    (v) => h("option", { value: v }, v)));
  const status = h("p", { id: "sweep-job", class: "muted" });
  const recent = h("div", { id: "sweep-jobs" });
  const drawn = h("div", { id: "sweep-result" });
  let stopFollowing = () => {};

  const attached = (await get("/api/saes")).data.filter((x) => x.attached_layer !== null);
  fill(sae, attached.map((x) => h("option", { value: x.id }, `${x.id} (layer ${x.attached_layer})`)));
  if (query.get("sae")) sae.value = query.get("sae");

  async function refresh() {
    const { data } = await get("/api/sweeps");
    fill(recent, data.length ? h("ul", null, data.slice(0, JOBS_SHOWN).map((j) => h("li", null,
      h("a", { href: "#", onclick: (e) => { e.preventDefault(); open(j.id); } }, describe(j)))))
      : h("p", { class: "muted" }, "No sweep yet."));
  }

  async function open(id) {
    const job = await ctx.attempt(() => get(`/api/sweeps/${seg(id)}`));
    if (!job) return;
    status.textContent = describe(job);
    status.dataset.status = job.status;
    if (job.status === "succeeded") drawSweep(drawn, job);
    else fill(drawn);
  }

  async function start() {
    const body = {
      sae: sae.value, feature: await ctx.attempt(() => resolve(sae.value, feature.value)),
      strengths: strengths.value.split(",").map((t) => t.trim()).filter(Boolean).map(Number),
      prompts: Number(prompts.value), held_out: Number(heldOut.value), tokens: Number(tokens.value), seed: Number(seed.value), scope: scope.value,
    };
    if (body.feature === undefined) return;
    if (concepts.value.trim()) body.concepts = concepts.value.split(",").map((c) => c.trim()).filter(Boolean);
    const job = await ctx.attempt(() => post("/api/sweeps", body), (j) => `Sweeping: job ${j.id}.`);
    if (!job) return;
    status.textContent = describe(job);
    status.dataset.status = job.status;
    fill(drawn);
    stopFollowing();
    stopFollowing = follow(`/api/sweeps/${seg(job.id)}`, {
      show: (now) => { status.textContent = describe(now); status.dataset.status = now.status; },
      ended: async (now) => {
        if (now.status === "succeeded") drawSweep(drawn, now);
        await refresh();
      },
      fail: ctx.fail,
    });
  }

  root.append(
    section("Sweep a feature",
      attached.length ? null : h("p", { class: "muted" }, "Attach an SAE or vector set first (SAEs or Vectors page)."),
      h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); start(); } },
        field("SAE or vector set", sae), field("feature", feature), field("strengths", strengths),
        field("prompts", prompts), field("held-out prompts", heldOut), field("tokens", tokens), field("seed", seed), field("concept words", concepts),
        field("scope", scope), h("button", { type: "submit", id: "sweep-go" }, "Sweep")),
      status),
    section("Result", drawn),
    section("Recent sweeps", recent));
  await refresh();
  return () => stopFollowing();
}
