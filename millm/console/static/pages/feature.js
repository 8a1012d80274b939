// Feature pages (#/features/SAE/INDEX; an SAE's or a vector set's): the card's label, firing rate and max
// activation, its top examples with every token shaded by the feature's value there, the tokens its decoder
// direction promotes and suppresses with their logits, its nearest features by decoder cosine at its layer, its
// recommended strength with the held-out measure that chose it, "steer with this" and "sweep this"; and a histogram
// of its activations over the corpus every install ships (read once per SAE by the server).
// #/features alone asks for an SAE and a feature.

import { get, patch, seg } from "../api.js";
import { bars } from "../chart.js";
import { figure } from "../plot.js";
import { field, fill, h, num, section, table } from "../dom.js";
import { resolve, steerChoice } from "../features.js";
import { heldOutLine, shaded } from "../research.js";
import { marked } from "./saes.js";

export const pageOf = (sae, index) => `#/features/${seg(sae)}/${seg(index)}`;

function examples(card) {
  const top = Math.max(card.max_activation || 0, ...card.examples.flatMap((e) => (e.tokens || []).map(([, v]) => v)));
  return h("ol", { id: "feature-examples" }, card.examples.map((e) => h("li", null,
    e.tokens && e.tokens.length ? shaded(e.tokens, top) : marked(e.text),
    h("span", { class: "muted" }, ` activation ${num(e.activation, 2)} (in its window)`))));
}

function logits(rows) {
  return table(["token", "logit"], rows.map((t) => [h("code", null, JSON.stringify(t.token)), num(t.logit, 3)]));
}

async function directions(slot, sae, index) {
  const d = await get(`/api/saes/${seg(sae)}/features/${seg(index)}/directions`).catch((err) => err);
  if (d instanceof Error) {
    fill(slot, h("p", { class: "muted" }, `Not read: ${d.message}`));
    return;
  }
  fill(slot,
    h("div", { class: "grid" },
      h("div", { id: "feature-promotes" }, h("h3", null, "Promotes"), logits(d.promotes)),
      h("div", { id: "feature-suppresses" }, h("h3", null, "Suppresses"), logits(d.suppresses))),
    h("h3", null, `Nearest by decoder cosine (layer ${d.layer ?? "?"})`),
    table(["feature", "label", "cosine"], d.nearest.map((n) => [
      h("a", { href: pageOf(n.sae, n.index) }, `${n.sae} #${n.index}`), n.label || "", num(n.cosine, 3)]),
    { id: "feature-nearest" }));
}

async function histogram(slot, sae, index) {
  const d = await get(`/api/saes/${seg(sae)}/features/${seg(index)}/histogram`).catch((err) => err);
  if (d instanceof Error) {
    fill(slot, h("p", { class: "muted" }, `Not read: ${d.message}`));
    return;
  }
  const share = `${num(100 * d.firing_fraction, 2)}%`;
  fill(slot,
    h("p", { id: "feature-firing" }, `Fires on ${d.firing} of ${d.tokens} tokens (${share}) of ${d.corpus}, layer ${d.layer}.`),
    d.firing ? h("div", { id: "feature-histogram" },
      bars(d.bins.map((b) => ({ name: `${num(b.low, 2)} to ${num(b.high, 2)}`, value: b.count })), { digits: 0 }))
      : null);
}

async function ask(root, ctx) {
  const { data } = await get("/api/saes");
  const pick = h("select", { id: "feature-sae" }, data.map((x) => h("option", { value: x.id }, x.id)));
  const name = h("input", { id: "feature-name", placeholder: "index or label" });
  root.append(section("Open a feature",
    h("form", { class: "inline", onsubmit: async (e) => {
      e.preventDefault();
      const index = await ctx.attempt(() => resolve(pick.value, name.value));
      if (index !== undefined) location.hash = pageOf(pick.value, index);
    } }, field("SAE or vector set", pick), field("feature", name), h("button", { type: "submit" }, "Open"))));
}

export async function render(root, ctx, route) {
  const [sae, index] = route.parts;
  if (sae === undefined || index === undefined) return ask(root, ctx);
  const card = await get(`/api/saes/${seg(sae)}/features/${seg(index)}`);
  const held = card.held_out;
  const rec = card.recommended_strength;
  const steer = h("button", { type: "button", id: "feature-steer", onclick: () => {
    const { strength, said } = steerChoice(card, sae, card.index);
    ctx.attempt(() => patch("/api/steering", { sae, values: { [card.index]: strength } }), said);
  } }, "Steer with this");
  const sweep = h("a", { href: `#/sweeps?sae=${seg(sae)}&feature=${seg(card.index)}`, id: "feature-sweep" },
    "Sweep this");
  const slot = h("div", { id: "feature-directions" }, h("p", { class: "muted" }, "…"));
  const spread = h("div", { id: "feature-spread" }, h("p", { class: "muted" }, "reading the corpus…"));
  root.append(
    section(`${sae} #${card.index}`,
      h("h3", { id: "feature-label" }, card.label || "(no label)"),
      h("dl", { class: "pairs" },
        h("dt", null, "firing rate"), h("dd", null, num(card.frequency, 5)),
        h("dt", null, "max activation"), h("dd", null, num(card.max_activation, 2)),
        h("dt", null, "recommended strength"), h("dd", { id: "feature-recommended" }, rec ?? "none"),
        h("dt", null, "measure"), h("dd", { id: "feature-held-out" }, held ? heldOutLine(held) : "not measured")),
      card.note ? h("p", { class: "muted" }, card.note) : null,
      h("p", null, steer, " ", sweep)),
    h("div", null, card.figure ? section("The calibration sweep that chose it",
      h("div", { id: "feature-sweep-figure" }, figure(card.figure))) : null),
    section("Top examples (each token shaded by the feature's value, read on the excerpt)", examples(card)),
    section("Direction", slot),
    section("Activations over a shipped corpus", spread));
  await Promise.all([directions(slot, sae, index), histogram(spread, sae, index)]);
  return null;
}
