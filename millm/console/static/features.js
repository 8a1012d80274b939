// What the pages know about features: a feature's card (label, firing rate, recommended strength), fetched
// once per feature, and the rule that turns "123=40, music=20" into {index: strength}.

import { get, post, seg } from "./api.js";

export const CLAMP = 200;
const cards = new Map();

/** A feature's card from GET /api/saes/{id}/features/{index}, fetched once. */
export function card(sae, index) {
  const key = `${sae}:${index}`;
  if (!cards.has(key)) {
    cards.set(key, get(`/api/saes/${seg(sae)}/features/${seg(index)}`).catch((err) => {
      cards.delete(key);
      throw err;
    }));
  }
  return cards.get(key);
}

/** A vector set's vector as a card: its name for a label, and the recommended strength and held-out measure its
 *  calibration stored (`millm vectors calibrate`; none before). */
export async function vectorCard(sae, index) {
  const set = await get(`/api/vectors/${seg(sae)}`);
  const vector = (set.vectors || []).find((v) => v.index === Number(index));
  const measured = await card(sae, index).catch(() => null);
  return { label: vector ? `vector ${vector.name}` : "",
           recommended_strength: measured ? measured.recommended_strength : null,
           held_out: measured ? measured.held_out : null };
}

/** How a card's strength was measured, in words: the held-out rate, its 90% interval and the answers it rests on
 *  and the prompt set and weights it was measured with (the card's held_out object, millm/sae/measured.py,
 *  whose describe() writes the same words); "" when the feature was never measured so. */
export function heldOut(c) {
  const held = c && c.held_out;
  if (!held) return "";
  const how = held.weights ? `${held.prompt_set}, ${held.weights} weights` : held.prompt_set;
  if (held.strength === null || held.strength === undefined) return `no strength mentions the concept (${how})`;
  const pct = (x) => `${Math.round(x * 100)}%`;
  return `held-out ${pct(held.rate)} [${pct(held.interval[0])}–${pct(held.interval[1])}] of ${held.answers} ` +
    `answers at ${held.strength} (${how})`;
}

/** The recommended strength with the held-out figures it rests on, or why there is none. */
export function recommendedText(c) {
  if (c && c.recommended_strength !== null && c.recommended_strength !== undefined) {
    return `${c.recommended_strength} · ${heldOut(c)}`;
  }
  return c && c.held_out ? `none · ${heldOut(c)}` : "not measured";
}

/** The strength a "steer" button sets when none is recommended: a starting point the Steering page adjusts. */
export const STEER_DEFAULT = 20;

/** What a "steer" button sets feature ``index`` of ``sae`` to, from its card ``c`` (null when unread): the
 *  recommended strength, else STEER_DEFAULT; and the notice saying which number it used and what it rests on (the
 *  held-out figures, or that none is recommended and the best held-out point), as ``--steer NAME`` says. */
export function steerChoice(c, sae, index) {
  const rec = c ? c.recommended_strength : null;
  if (rec !== null && rec !== undefined) {
    return { strength: rec, said: `Feature ${index} set to its recommended strength ${rec} on ${sae} ` +
      `(${heldOut(c)}); the Steering page adjusts it.` };
  }
  const why = c && c.held_out ? `none is recommended: ${heldOut(c)}` : "never measured on held-out prompts";
  return { strength: STEER_DEFAULT, said: `Feature ${index} set to ${STEER_DEFAULT} on ${sae}, a starting ` +
    `point (${why}); the Steering page adjusts it.` };
}

/** A strength within the ±200 clamp the server applies. */
export function clamp(value) {
  return Math.max(-CLAMP, Math.min(CLAMP, Number(value)));
}

/** Label search, as GET /api/saes/{id}/features?q= ranks it. */
export async function search(sae, query) {
  const found = await get(`/api/saes/${seg(sae)}/features?q=${encodeURIComponent(query)}`);
  return found.features;
}

/** The one feature a name denotes on an SAE (an index, else the label search's single closest match), by the
 *  rule --steer uses: POST /api/saes/{id}/resolve; its refusal (none or several match) is the error. */
export async function resolve(sae, name) {
  const found = await post(`/api/saes/${seg(sae)}/resolve`, { names: [name] });
  return found.features[0].index;
}

/** "123=40, music, 9=-15" resolved by the rule --steer uses (POST /api/saes/{id}/resolve): {values, said}, a
 *  feature alone at its recommended strength (said names each such strength), or an error naming the item. */
export async function resolveSteer(sae, text) {
  const items = String(text).split(/[,\n]/).map((t) => t.trim()).filter(Boolean);
  if (!items.length) throw new Error("Nothing to add: write FEATURE=STRENGTH or FEATURE, e.g. 123=40, music.");
  return post(`/api/saes/${seg(sae)}/resolve`, { steer: items });
}
