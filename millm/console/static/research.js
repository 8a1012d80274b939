// The research figures the pages draw: a sweep's concept rate, fluency and relevance against strength.

import { figure } from "./plot.js";

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
