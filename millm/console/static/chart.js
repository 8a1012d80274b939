// A horizontal bar chart in plain SVG (no library): one bar per item, longest first, labels as text nodes.

import { s } from "./dom.js";

const WIDTH = 560;
const BAR = 18;
const GAP = 6;
const LEFT = 230;
const LABEL_CHARS = 34; // longer labels are cut with an ellipsis (the table beside shows them whole)

/** An SVG chart of ``items`` ([{name, value}]), scaled to the largest value. */
export function bars(items, { unit = "", digits = 3 } = {}) {
  const top = Math.max(...items.map((i) => Math.abs(i.value)), 1e-9);
  const height = Math.max(items.length, 1) * (BAR + GAP) + GAP;
  const svg = s("svg", { viewBox: `0 0 ${WIDTH} ${height}`, width: WIDTH, height, class: "chart",
                         role: "img", "aria-label": "bar chart" });
  items.forEach((item, i) => {
    const y = GAP + i * (BAR + GAP);
    const length = Math.max(1, ((WIDTH - LEFT - 70) * Math.abs(item.value)) / top);
    svg.append(
      s("text", { x: LEFT - 6, y: y + BAR - 5, "text-anchor": "end", class: "chart-label" },
        item.name.length > LABEL_CHARS ? `${item.name.slice(0, LABEL_CHARS - 1)}…` : item.name),
      s("rect", { x: LEFT, y, width: length, height: BAR, rx: 2, class: "chart-bar", "data-name": item.name }),
      s("text", { x: LEFT + length + 4, y: y + BAR - 5, class: "chart-value" }, `${item.value.toFixed(digits)}${unit}`));
  });
  return svg;
}

const SPARK_W = 220;
const SPARK_H = 36;

/** A sparkline of ``values`` (oldest first) in plain SVG: one polyline scaled to the largest value, its points
 *  marked so a single value still shows. */
export function sparkline(values, { label = "" } = {}) {
  const top = Math.max(...values.map((v) => Math.abs(v)), 1e-9);
  const step = values.length > 1 ? (SPARK_W - 8) / (values.length - 1) : 0;
  const points = values.map((v, i) => [4 + i * step, SPARK_H - 4 - ((SPARK_H - 8) * Math.max(0, v)) / top]);
  const svg = s("svg", { viewBox: `0 0 ${SPARK_W} ${SPARK_H}`, width: SPARK_W, height: SPARK_H, class: "spark",
                         role: "img", "aria-label": label || "sparkline" });
  svg.append(s("polyline", { points: points.map(([x, y]) => `${x.toFixed(1)},${y.toFixed(1)}`).join(" "),
                             class: "spark-line" }));
  for (const [x, y] of points) {
    svg.append(s("circle", { cx: x.toFixed(1), cy: y.toFixed(1), r: 2, class: "spark-dot" }));
  }
  return svg;
}
