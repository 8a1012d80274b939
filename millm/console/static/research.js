// What the research pages share: a held-out measure as one line, and tokens shaded by their values. (Figures come
// described by the server, millm.research.figures, and are drawn by plot.js.)

import { h, num } from "./dom.js";

/** A held-out measure as one line: the strength, its rate and 90% interval, recommended or not. */
export function heldOutLine(held) {
  if (!held) return "";
  if (held.strength === null || held.strength === undefined) return "held out: no strength to verify";
  const [lo, hi] = held.interval || [null, null];
  const on = held.weights ? `, ${held.weights} weights` : "";
  return `held out (${held.answers} answers${on}): rate ${num(held.rate, 2)}, 90% interval [${num(lo, 2)}, ${num(hi, 2)}]`
    + ` at ${held.strength}: ${held.recommended ? "recommended" : "not recommended"}`;
}

/** Tokens ([[text, value], ...]) as spans shaded by value (``top``: the value shown fullest), each with its value in
 *  ``data-value`` and a tooltip; text only, never markup. */
export function shaded(tokens, top) {
  const scale = top > 0 ? top : Math.max(1e-9, ...tokens.map(([, v]) => v));
  return h("span", { class: "shaded" }, tokens.map(([text, value]) => {
    const span = h("span", { class: "tok", "data-value": value, title: `${JSON.stringify(text)}: ${value}` }, text);
    span.style.setProperty("--a", Math.max(0, Math.min(1, value / scale)).toFixed(3));
    return span;
  }));
}
