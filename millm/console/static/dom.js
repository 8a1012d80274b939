// Building the page from data without ever parsing it as markup: every string becomes a text node
// (textContent), attributes are set one by one, so a label like <img src=x onerror=alert(1)> shows as text.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function assign(node, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (name === "class") node.className = value;
    else if (name === "text") node.textContent = String(value);
    else if (name in node && !(node instanceof SVGElement) && name !== "list") node[name] = value;
    else node.setAttribute(name, value === true ? "" : String(value));
  }
}

/** An HTML element: h("button", {onclick}, "text", child...). */
export function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  assign(node, attrs);
  return append(node, children);
}

/** An SVG element, attributes set as attributes. */
export function s(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) node.setAttribute(name, String(value));
  return append(node, children);
}

/** Replace a node's children. */
export function fill(node, ...children) {
  node.replaceChildren();
  return append(node, children);
}

/** A table: header cells, then rows of cells (strings or nodes). */
export function table(columns, rows, attrs) {
  return h("table", attrs,
    h("thead", null, h("tr", null, columns.map((c) => h("th", null, c)))),
    h("tbody", null, rows.map((cells) => h("tr", null, cells.map((c) => h("td", null, c))))));
}

/** A titled section of a page. */
export function section(title, ...children) {
  return h("section", { class: "card" }, h("h2", null, title), ...children);
}

/** A number for display: fixed digits, or a dash for none. */
export function num(value, digits = 2) {
  if (value === null || value === undefined || Number.isNaN(Number(value))) return "–";
  return Number(value).toFixed(digits);
}

/** A labelled input row. */
export function field(label, input) {
  return h("label", { class: "field" }, h("span", null, label), input);
}
