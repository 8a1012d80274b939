// SAEs: the registered SAEs (add by path, attach at a layer, detach, delete), feature search by label with
// firing rate and recommended strength, and a feature's card (examples with the firing token marked).

import { del, get, patch, post, seg } from "../api.js";
import { field, fill, h, num, section, table } from "../dom.js";
import { card, recommendedText, search, steerChoice } from "../features.js";

const CARDS_SHOWN = 10; // results whose cards (firing rate, recommended strength) are fetched

/** An example's text with the firing token (between « and ») in a <mark>, all as text nodes. */
export function marked(text) {
  const parts = String(text).split(/«|»/);
  return h("span", { class: "example" }, parts.map((part, i) => (i % 2 ? h("mark", null, part) : part)));
}

function cardView(c) {
  return h("div", { id: "feature-card" },
    h("h3", null, `#${c.index} `, h("span", { class: "label" }, c.label || "(no label)")),
    h("dl", { class: "pairs" },
      h("dt", null, "firing rate"), h("dd", null, num(c.frequency, 5)),
      h("dt", null, "max activation"), h("dd", null, num(c.max_activation, 2)),
      h("dt", null, "recommended strength"), h("dd", { class: "recommended" }, recommendedText(c)),
      h("dt", null, "calibration rate"), h("dd", null, num(c.held_out && c.held_out.calibration_rate, 2))),
    h("h4", null, "Top examples"),
    h("ol", null, (c.examples || []).map((e) => h("li", null, marked(e.text), h("span", { class: "muted" },
      ` ${num(e.activation, 2)}`)))),
    h("h4", null, "Promotes"),
    h("p", { class: "tokens" }, (c.promotes || []).map((t) => h("code", null, t))));
}

export async function render(root, ctx) {
  const list = h("div", { id: "sae-list" });
  const path = h("input", { id: "sae-path", placeholder: "/path/to/sae folder or params.npz", size: 40 });
  const pick = h("select", { id: "search-sae" });
  const query = h("input", { id: "search-q", placeholder: "label, e.g. music", type: "search" });
  const results = h("div", { id: "search-results" });
  const cardSlot = h("div", { id: "card-slot" });

  async function refresh() {
    const { data } = await get("/api/saes");
    fill(list, table(["SAE", "format", "architecture", "features", "layer hint", "attached", ""], data.map((sae) => {
      const layer = h("input", { type: "number", min: 0, value: sae.layer_hint ?? 0, class: "layer",
                                 "aria-label": `layer for ${sae.id}` });
      const actions = sae.attached_layer === null
        ? [layer, h("button", { type: "button", "data-action": "attach", onclick: () => act(
          post(`/api/saes/${seg(sae.id)}/attach`, { layer: Number(layer.value) }), `Attached ${sae.id}.`) }, "attach")]
        : [h("button", { type: "button", "data-action": "detach", onclick: () => act(
          post(`/api/saes/${seg(sae.id)}/detach`), `Detached ${sae.id}.`) }, "detach")];
      actions.push(h("button", { type: "button", class: "danger", "data-action": "delete", onclick: () => act(
        del(`/api/saes/${seg(sae.id)}`), `Deleted ${sae.id}.`) }, "delete"));
      return [sae.id, sae.format, sae.architecture, String(sae.d_sae), String(sae.layer_hint ?? "–"),
              sae.attached_layer === null ? "no" : `layer ${sae.attached_layer}`, h("span", null, actions)];
    }), { id: "sae-table" }));
    const chosen = pick.value;
    fill(pick, data.map((sae) => h("option", { value: sae.id }, sae.id)));
    if (chosen) pick.value = chosen;
  }

  async function act(promise, message) {
    await ctx.attempt(() => promise, message);
    await refresh().catch(ctx.fail);
  }

  async function find() {
    const sae = pick.value;
    const found = await ctx.attempt(() => search(sae, query.value.trim()));
    if (!found) return;
    const rows = found.map((f, i) => {
      const rate = h("span", null, i < CARDS_SHOWN ? "…" : "");
      const rec = h("span", null, "");
      if (i < CARDS_SHOWN) {
        card(sae, f.index).then((c) => {
          rate.textContent = num(c.frequency, 5);
          rec.textContent = c.held_out ? recommendedText(c) : "–";
        }).catch(() => { rate.textContent = "–"; });
      }
      const show = h("button", { type: "button", class: "small", "data-action": "card", onclick: async () => {
        const c = await ctx.attempt(() => card(sae, f.index));
        if (c) fill(cardSlot, cardView(c));
      } }, "card");
      const steer = h("button", { type: "button", class: "small", "data-action": "steer", onclick: async () => {
        const { strength, said } = steerChoice(await ctx.attempt(() => card(sae, f.index)), sae, f.index);
        await ctx.attempt(() => patch("/api/steering", { sae, values: { [f.index]: strength } }), said);
      } }, "steer");
      const page = h("a", { href: `#/features/${seg(sae)}/${f.index}`, "data-action": "page" }, "page");
      return [String(f.index), h("span", { class: "label" }, f.label), rate, rec, h("span", null, show, steer, page)];
    });
    fill(results, rows.length
      ? table(["feature", "label", "firing rate", "recommended", ""], rows, { id: "search-table" })
      : h("p", { class: "muted" }, "No feature label matches."));
  }

  root.append(
    section("Registered SAEs", list,
      h("form", { class: "inline", onsubmit: (e) => {
        e.preventDefault();
        act(post("/api/saes", { path: path.value.trim() }), "Registered.");
      } }, field("add by path", path), h("button", { type: "submit", id: "sae-add" }, "Add"))),
    section("Feature search",
      h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); find(); } },
        field("SAE", pick), field("label", query), h("button", { type: "submit", id: "search-go" }, "Search")),
      results),
    section("Feature card", cardSlot));
  await refresh();
  return null;
}
