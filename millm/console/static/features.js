// What the pages know about features: a feature's card (label, firing rate, recommended strength), fetched
// once per feature, and the rule that turns "123=40, music=20" into {index: strength}.

import { get, seg } from "./api.js";

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
 *  (the card's held_out object, millm/sae/measured.py); "" when the feature was never measured so. */
export function heldOut(c) {
  const held = c && c.held_out;
  if (!held) return "";
  if (held.strength === null || held.strength === undefined) return "no strength mentions the concept";
  const pct = (x) => `${Math.round(x * 100)}%`;
  return `held-out ${pct(held.rate)} [${pct(held.interval[0])}–${pct(held.interval[1])}] of ${held.answers} ` +
    `answers at ${held.strength} (${held.prompt_set})`;
}

/** The recommended strength with the held-out figures it rests on, or why there is none. */
export function recommendedText(c) {
  if (c && c.recommended_strength !== null && c.recommended_strength !== undefined) {
    return `${c.recommended_strength} · ${heldOut(c)}`;
  }
  return c && c.held_out ? `none · ${heldOut(c)}` : "not measured";
}

/** A feature's recommended strength (its card's), for FEATURE named without a strength; an Error saying there is
 *  none, with the best held-out point, where there is none. */
export async function recommendedOf(sae, index, name) {
  const c = await card(sae, index);
  if (c.recommended_strength !== null && c.recommended_strength !== undefined) return c.recommended_strength;
  throw new Error(`'${name}' (feature ${index}) has no recommended strength: ` +
    (c.held_out ? `the best held-out point misses the target (${heldOut(c)})` : "it was never measured") +
    `; write ${name}=STRENGTH.`);
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

function terms(label) {
  return String(label).toLowerCase().split(",").map((t) => t.trim()).filter(Boolean);
}

/** The one feature a name denotes on an SAE: an index, else the label search's single closest match. */
export async function resolve(sae, name) {
  const text = name.trim().replace(/^#/, "");
  if (/^\d+$/.test(text)) return Number(text);
  const q = text.toLowerCase();
  const found = await search(sae, text);
  const tiers = [
    found.filter((f) => terms(f.label)[0] === q),
    found.filter((f) => terms(f.label).includes(q)),
    found,
  ];
  for (const tier of tiers) {
    if (tier.length === 1) return tier[0].index;
    if (tier.length > 1) {
      const shown = tier.slice(0, 5).map((f) => `${f.index} (${f.label})`).join(", ");
      throw new Error(`'${name}' is ambiguous: it matches ${tier.length} features: ${shown}. Name one by index.`);
    }
  }
  throw new Error(`'${name}' matches no feature label of ${sae}.`);
}

/** "123=40, music=20" as [[name, strength], ...]; a malformed item is an error naming it. */
export function parseBatch(text) {
  const items = String(text).split(/[,\n]/).map((t) => t.trim()).filter(Boolean);
  if (!items.length) throw new Error("Nothing to add: write FEATURE=STRENGTH, e.g. 123=40, music=20.");
  return items.map((item) => {
    if (!item.includes("=")) return [item, null]; // FEATURE alone: its recommended strength (recommendedOf)
    const at = item.lastIndexOf("=");
    const value = Number(item.slice(at + 1));
    if (at <= 0 || item.slice(at + 1).trim() === "" || !Number.isFinite(value)) {
      throw new Error(`'${item}' is not FEATURE=STRENGTH (e.g. 123=40 or music=20).`);
    }
    return [item.slice(0, at).trim(), value];
  });
}
