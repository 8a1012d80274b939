// Token read-outs: an answer's generated tokens as return_sae_activations gave them (token_text, labels), each
// shaded by one chosen feature's value and clickable: the features strongest at that position, each one click
// from the steering table, from its feature page, or from shading the whole answer by it.

import { patch, seg } from "./api.js";
import { fill, h, num, table } from "./dom.js";

const STEER_DEFAULT = 20;

/** The read-out of a streamed answer: the chunk's millm.sae_activations, or null. */
export function readoutOf(chunks) {
  const last = chunks.find((c) => c.millm && c.millm.sae_activations);
  return last ? last.millm.sae_activations : null;
}

/** ``readout``'s positions as shaded, clickable token spans; ``rest`` (text after the last read position: the final
 *  token, which is never read) as plain text. ``shade`` (a feature index or null) picks the feature shown. */
export function readoutView(readout, rest, ctx, shade = null) {
  const detail = h("div", { class: "readout-detail" });
  const tokens = h("div", { class: "readout-tokens" });
  const top = (f) => Math.max(1e-9, ...readout.positions.map((p) => valueOf(p, f)));
  const valueOf = (p, f) => (p.features.find((x) => x.index === f) || { value: 0 }).value;

  function draw(feature) {
    const scale = feature === null ? 0 : top(feature);
    fill(tokens, readout.positions.map((p) => {
      const value = feature === null ? 0 : valueOf(p, feature);
      const span = h("span", { class: "tok", tabindex: 0, "data-position": p.position, "data-value": value,
                               title: `position ${p.position}`, onclick: () => open(p) }, p.token ?? "");
      span.style.setProperty("--a", scale ? (value / scale).toFixed(3) : "0");
      return span;
    }), rest);
  }

  function open(p) {
    fill(detail, h("p", { class: "muted" }, `position ${p.position}: ${JSON.stringify(p.token ?? "")}`),
      table(["feature", "label", "value", ""], p.features.map((f) => [String(f.index), f.label ?? "", num(f.value, 3),
        h("span", { "data-feature": f.index },
          h("button", { type: "button", class: "small", "data-action": "shade", onclick: () => draw(f.index) }, "shade"),
          h("button", { type: "button", class: "small", "data-action": "steer", onclick: () => ctx.attempt(
            () => patch("/api/steering", { sae: readout.sae_id, values: { [f.index]: STEER_DEFAULT } }),
            `Feature ${f.index} set to ${STEER_DEFAULT} on ${readout.sae_id}; the Steering page adjusts it.`) }, "steer"),
          h("a", { href: `#/features/${seg(readout.sae_id)}/${f.index}` }, "page"))]), { class: "readout-table" }));
  }

  draw(shade);
  return h("div", { class: "readout", "data-sae": readout.sae_id }, tokens, detail);
}
