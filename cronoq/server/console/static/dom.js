// Building the page without ever parsing markup: elements are created one by one and every piece
// of text (which may come from other tenants: keys, messages, payloads) goes into a text node.
// The Content-Security-Policy's Trusted Types rule makes any assignment of markup fail anyway.

const SVG_NS = "http://www.w3.org/2000/svg";

function append(parent, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(parent, child);
    else if (child instanceof Node) parent.appendChild(child);
    else parent.appendChild(document.createTextNode(String(child)));
  }
}

function apply(element, attrs) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") {
      element.addEventListener(name.slice(2), value);
    } else if (name === "dataset") {
      Object.assign(element.dataset, value);
    } else if (name === "href" && !/^#/.test(String(value))) {
      throw new Error("links stay inside the console");
    } else {
      element.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

// h("tr", {class: "x"}, "text", child, [more]) -> an element.
export function h(tag, attrs, ...children) {
  const element = document.createElement(tag);
  apply(element, attrs);
  append(element, children);
  return element;
}

export function svg(tag, attrs, ...children) {
  const element = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attrs || {})) element.setAttribute(name, String(value));
  append(element, children);
  return element;
}

export function replace(parent, ...children) {
  parent.replaceChildren();
  append(parent, children);
}

export function table(headings, rows, attrs) {
  return h("table", attrs, h("thead", null, h("tr", null, headings.map((text) => h("th", null, text)))),
    h("tbody", null, rows));
}

export function field(label, value) {
  return [h("dt", null, label), h("dd", null, value)];
}
