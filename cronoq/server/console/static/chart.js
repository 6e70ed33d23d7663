// Live line charts drawn as SVG: a fixed window of samples per series, redrawn on each sample.

import { h, svg } from "./dom.js";

const WIDTH = 320;
const HEIGHT = 110;
const PAD = { left: 36, right: 6, top: 8, bottom: 16 };

function niceMax(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (value <= step * power) return step * power;
  }
  return 10 * power;
}

// series: [{name, className}]; format(value) labels the axis.
export class LineChart {
  constructor(title, series, { samples = 90, format = String } = {}) {
    this.series = series;
    this.samples = samples;
    this.format = format;
    this.values = series.map(() => []);
    this.plot = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, class: "chart-plot", role: "img",
      "aria-label": title });
    this.element = h("figure", { class: "chart" }, h("figcaption", null, title,
      h("span", { class: "legend" }, series.map((s) => h("span", { class: `key ${s.className}` }, s.name)))),
    this.plot);
  }

  push(values) {
    values.forEach((value, index) => {
      const list = this.values[index];
      list.push(Number.isFinite(value) ? value : 0);
      if (list.length > this.samples) list.shift();
    });
    this.draw();
  }

  draw() {
    const top = niceMax(Math.max(0, ...this.values.flat()));
    const innerW = WIDTH - PAD.left - PAD.right;
    const innerH = HEIGHT - PAD.top - PAD.bottom;
    const x = (i) => PAD.left + (innerW * i) / Math.max(1, this.samples - 1);
    const y = (v) => PAD.top + innerH - (innerH * v) / top;
    const children = [
      svg("line", { x1: PAD.left, y1: y(0), x2: WIDTH - PAD.right, y2: y(0), class: "axis" }),
      svg("line", { x1: PAD.left, y1: y(top), x2: WIDTH - PAD.right, y2: y(top), class: "grid" }),
      svg("text", { x: PAD.left - 4, y: y(top) + 4, class: "tick", "text-anchor": "end" }, this.format(top)),
      svg("text", { x: PAD.left - 4, y: y(0), class: "tick", "text-anchor": "end" }, "0"),
      svg("text", { x: WIDTH - PAD.right, y: HEIGHT - 2, class: "tick", "text-anchor": "end" }, "now"),
    ];
    this.values.forEach((list, index) => {
      if (!list.length) return;
      const offset = this.samples - list.length;
      const points = list.map((v, i) => `${x(offset + i).toFixed(1)},${y(v).toFixed(1)}`).join(" ");
      children.push(svg("polyline", { points, class: `line ${this.series[index].className}` }));
    });
    this.plot.replaceChildren(...children);
  }
}
