// A horizontal bar chart in plain SVG (no library): one bar per item, longest first, labels as text nodes.

import { s } from "./dom.js";

const WIDTH = 560;
const BAR = 18;
const GAP = 6;
const LEFT = 230;
const LABEL_CHARS = 34; // longer labels are cut with an ellipsis (the table beside shows them whole)

/** An SVG chart of ``items`` ([{name, value}]), scaled to the largest value. */
export function bars(items, { unit = "" } = {}) {
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
      s("text", { x: LEFT + length + 4, y: y + BAR - 5, class: "chart-value" }, `${item.value.toFixed(3)}${unit}`));
  });
  return svg;
}
