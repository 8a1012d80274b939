// What the research pages share: a sweep's figure (concept rate, fluency and relevance against strength), a held-out
// measure as one line, and a feature's example tokens shaded by their values.

import { h, num } from "./dom.js";
import { figure } from "./plot.js";

/** A held-out measure as one line: the strength, its rate and 90% interval, recommended or not. */
export function heldOutLine(held) {
  if (!held) return "";
  if (held.strength === null || held.strength === undefined) return "held out: no strength to verify";
  const [lo, hi] = held.interval || [null, null];
  return `held out (${held.answers} answers): rate ${num(held.rate, 2)}, 90% interval [${num(lo, 2)}, ${num(hi, 2)}]`
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

/** A sweep result (``millm steer sweep --json``'s body) as a figure: concept rate with the target rate, fluency
 *  and relevance with the fluency bound, ``mark`` (the strength chosen) as a vertical line; ``pick(i)`` hears the
 *  index of a clicked point. */
export function sweepFigure(result, mark, pick) {
  const points = result.points;
  return figure({
    xs: points.map((p) => p.strength),
    xLabel: "strength",
    panels: [
      { title: "concept rate (share of answers that mention the concept)", min: 0, max: 1,
        series: [{ name: "concept rate", cls: "s1", values: points.map((p) => p.rate) }],
        lines: [{ y: result.target, cls: "ref-target", label: `target ${result.target}` }] },
      { title: "fluency and relevance against the unsteered answers (nats/token)",
        series: [{ name: "fluency", cls: "s2", values: points.map((p) => p.fluency) },
                 { name: "relevance", cls: "s3", values: points.map((p) => p.relevance) }],
        lines: [{ y: -result.bound, cls: "ref-bound", label: `bound -${result.bound}` }] },
    ],
    mark: mark === null || mark === undefined ? null : { x: mark, label: `chosen ${mark}` },
    pick,
  });
}
