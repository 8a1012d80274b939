// Line charts in plain SVG (no library): a figure of stacked panels sharing one x axis, each with its series,
// reference lines (a target, a bound) and a marked x (the recommended strength). Colours come from the
// stylesheet's classes, so the light and dark themes both read. Every point is a circle a click picks.

import { s } from "./dom.js";

const WIDTH = 620;
const PANEL = 150;
const GAP = 34;
const LEFT = 56;
const RIGHT = 120;
const TOP = 16;

function ticks(lo, hi, count = 4) {
  const step = (hi - lo) / count;
  return Array.from({ length: count + 1 }, (_, i) => lo + i * step);
}

function fmt(v) {
  const a = Math.abs(v);
  return a >= 100 || a === 0 ? v.toFixed(0) : a >= 1 ? v.toFixed(1) : v.toFixed(2);
}

/** The y range a panel shows: its own ``min``/``max`` where given, else its values and lines, padded. */
function range(panel) {
  const values = panel.series.flatMap((x) => x.values).concat((panel.lines || []).map((l) => l.y))
    .filter((v) => Number.isFinite(v));
  let lo = panel.min ?? Math.min(...values, 0);
  let hi = panel.max ?? Math.max(...values, 0);
  if (hi - lo < 1e-9) { lo -= 1; hi += 1; }
  return [lo, hi];
}

/** An SVG figure as millm.research.figures describes one: ``xs`` (shared x values), ``panels`` ([{title, series:
 *  [{name, cls, values}], lines: [{y, cls, label}], min?, max?}]), ``mark`` ({x, label}: a vertical line through
 *  every panel), ``x_label``; ``pick(i)`` is called with the index of a clicked point. */
export function figure({ xs, panels, mark = null, x_label: xLabel = "" }, pick = null) {
  const height = TOP + panels.length * (PANEL + GAP) + 8;
  const svg = s("svg", { viewBox: `0 0 ${WIDTH} ${height}`, width: WIDTH, height, class: "plot", role: "img",
                         "aria-label": panels.map((p) => p.title).join("; ") });
  const xlo = Math.min(...xs);
  const xhi = Math.max(...xs);
  const xspan = xhi - xlo || 1;
  const px = (x) => LEFT + ((x - xlo) / xspan) * (WIDTH - LEFT - RIGHT);
  panels.forEach((panel, k) => {
    const y0 = TOP + k * (PANEL + GAP);
    const [lo, hi] = range(panel);
    const py = (y) => y0 + PANEL - ((y - lo) / (hi - lo)) * PANEL;
    svg.append(s("text", { x: LEFT, y: y0 - 4, class: "plot-title" }, panel.title));
    for (const t of ticks(lo, hi)) {
      svg.append(s("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: py(t), y2: py(t), class: "plot-grid" }),
        s("text", { x: LEFT - 4, y: py(t) + 4, "text-anchor": "end", class: "plot-tick" }, fmt(t)));
    }
    for (const x of xs) {
      svg.append(s("text", { x: px(x), y: y0 + PANEL + 14, "text-anchor": "middle", class: "plot-tick" }, String(x)));
    }
    for (const line of panel.lines || []) {
      svg.append(s("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: py(line.y), y2: py(line.y), class: `plot-ref ${line.cls}`,
                             "data-line": line.label }),
        s("text", { x: WIDTH - RIGHT + 4, y: py(line.y) + 4, class: `plot-label ${line.cls}` }, line.label));
    }
    if (mark) {
      svg.append(s("line", { x1: px(mark.x), x2: px(mark.x), y1: y0, y2: y0 + PANEL, class: "plot-mark",
                             "data-mark": mark.x }));
      if (k === 0) svg.append(s("text", { x: px(mark.x) + 3, y: y0 + 10, class: "plot-label plot-mark-text" },
        mark.label));
    }
    panel.series.forEach((series, j) => {
      const pts = xs.map((x, i) => [px(x), py(series.values[i]), i]).filter(([, y]) => Number.isFinite(y));
      svg.append(s("polyline", { points: pts.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" "),
                                 class: `plot-line ${series.cls}` }));
      for (const [x, y, i] of pts) {
        const dot = s("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: 4, class: `plot-dot ${series.cls}`,
                                  "data-series": series.name, "data-x": xs[i], "data-y": series.values[i],
                                  tabindex: 0 },
          s("title", null, `${series.name} at ${xs[i]}: ${fmt(series.values[i])}`));
        if (pick) dot.addEventListener("click", () => pick(i));
        svg.append(dot);
      }
      svg.append(s("text", { x: WIDTH - RIGHT + 4, y: y0 + 12 + 14 * j, class: `plot-label ${series.cls}` },
        series.name));
    });
  });
  if (xLabel) svg.append(s("text", { x: (LEFT + WIDTH - RIGHT) / 2, y: height - 2, "text-anchor": "middle",
                                     class: "plot-tick" }, xLabel));
  return svg;
}
