// Line charts of figures sampled over time, drawn on a canvas: a rolling window of the last minutes.

import { el } from "./dom.js";

const MARGIN = { left: 52, right: 12, top: 10, bottom: 24 };
const GRID_LINES = 4;
// Where series coincide (deliveries equal to publishes, all messages unacked...) every one stays visible: the first
// listed is drawn on top and thinnest, each one under it wider (its edges show around it) and with dashes of its own
// (it shows through their gaps), the last solid.
const WIDTH = 2; // of the line on top
const WIDTH_STEP = 3; // each line under it this much wider
const DASHES = [[5, 5], [12, 4], [2, 4]];

/** The line style of the series at index of count: { width, dash } (dash: [] for a solid line). */
export function lineStyle(index, count, line = {}) {
  const width = line.width ?? WIDTH + WIDTH_STEP * index;
  const dash = line.dash ?? (index === count - 1 ? [] : DASHES[index % DASHES.length]);
  return { width, dash };
}

/** A small line in a series' colour and style, for its legend entry. */
function swatchOf(color, style) {
  const swatch = el("canvas", { class: "swatch", width: 28, height: 12, "aria-hidden": "true" });
  const context = swatch.getContext("2d");
  context.strokeStyle = color;
  context.lineWidth = Math.min(style.width, 8);
  context.setLineDash(style.dash);
  context.beginPath();
  context.moveTo(0, 6);
  context.lineTo(28, 6);
  context.stroke();
  return swatch;
}

/** The grid's step: the smallest of 1, 2, 2.5, 5 times a power of ten at or above value, and at least least. */
function niceStep(value, least) {
  if (!(value > least)) return least;
  const power = 10 ** Math.floor(Math.log10(value));
  const fraction = value / power;
  const nice = fraction <= 1 ? 1 : fraction <= 2 ? 2 : fraction <= 2.5 ? 2.5 : fraction <= 5 ? 5 : 10;
  return nice * power;
}

function axisLabel(value) {
  if (value >= 1e6) return `${+(value / 1e6).toFixed(1)}M`;
  if (value >= 1e3) return `${+(value / 1e3).toFixed(1)}k`;
  return `${+value.toFixed(2)}`;
}

export class LineChart {
  /**
   * series: [{ key, label, color, width, dash }] (width and dash: lineStyle's unless given); format(value) writes a
   * value in the legend; windowSeconds: how far back the chart reaches; counts: whole numbers only on the axis.
   */
  constructor({ id, title, series, format = String, windowSeconds = 300, counts = false }) {
    this.series = series.map((line, index) => ({ ...line, ...lineStyle(index, series.length, line) }));
    this.leastStep = counts ? 1 : 0.25;
    this.format = format;
    this.windowSeconds = windowSeconds;
    this.samples = []; // { time (seconds), values: { key: number } }, oldest first
    this.canvas = el("canvas", { role: "img", "aria-label": title });
    this.legendValues = new Map();
    const legend = el(
      "ul",
      { class: "legend" },
      this.series.map((line) => {
        const value = el("span", { class: "legend-value" });
        this.legendValues.set(line.key, value);
        const style = { "data-series": line.key, "data-width": line.width, "data-dash": line.dash.join(" ") || "solid" };
        return el("li", style, swatchOf(line.color, line), line.label, " ", value);
      }),
    );
    this.element = el("figure", { class: "chart", id }, el("figcaption", {}, title), this.canvas, legend);
  }

  /** Add the figures of one moment (values: { key: number }) and forget those out of the window. */
  add(time, values) {
    this.samples.push({ time, values });
    const oldest = time - this.windowSeconds - 60;
    while (this.samples.length && this.samples[0].time < oldest) this.samples.shift();
    for (const line of this.series) this.legendValues.get(line.key).textContent = this.format(values[line.key]);
    this.draw();
  }

  draw() {
    const canvas = this.canvas;
    const width = canvas.clientWidth;
    const height = canvas.clientHeight;
    if (!width || !height) return; // not shown now; drawn when shown
    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const context = canvas.getContext("2d");
    context.setTransform(ratio, 0, 0, ratio, 0, 0);
    context.clearRect(0, 0, width, height);

    const plot = {
      left: MARGIN.left,
      top: MARGIN.top,
      width: width - MARGIN.left - MARGIN.right,
      height: height - MARGIN.top - MARGIN.bottom,
    };
    const end = this.samples.length ? this.samples[this.samples.length - 1].time : Date.now() / 1000;
    const start = end - this.windowSeconds;
    const visible = this.samples.filter((sample) => sample.time >= start);
    let highest = 0;
    for (const sample of visible) for (const line of this.series) highest = Math.max(highest, sample.values[line.key] || 0);
    const top = niceStep(highest / GRID_LINES, this.leastStep) * GRID_LINES;
    const x = (time) => plot.left + ((time - start) / this.windowSeconds) * plot.width;
    const y = (value) => plot.top + plot.height - (value / top) * plot.height;

    this.drawAxes(context, plot, top, x, end);
    context.lineJoin = "round";
    for (const line of this.series.slice().reverse()) { // the first listed on top
      context.strokeStyle = line.color;
      context.lineWidth = line.width;
      context.setLineDash(line.dash);
      context.beginPath();
      visible.forEach((sample, index) => {
        const point = [x(sample.time), y(sample.values[line.key] || 0)];
        if (index === 0) context.moveTo(...point);
        else context.lineTo(...point);
      });
      if (visible.length === 1) context.lineTo(x(visible[0].time) - 2, y(visible[0].values[line.key] || 0));
      context.stroke();
    }
    context.setLineDash([]);
  }

  drawAxes(context, plot, top, x, end) {
    const styles = getComputedStyle(this.canvas);
    context.font = `11px ${styles.fontFamily}`;
    context.fillStyle = styles.color;
    context.strokeStyle = styles.getPropertyValue("--grid").trim() || "#ddd";
    context.lineWidth = 1;
    context.textAlign = "right";
    context.textBaseline = "middle";
    for (let step = 0; step <= GRID_LINES; step += 1) {
      const value = (top * step) / GRID_LINES;
      const lineY = Math.round(plot.top + plot.height - (step / GRID_LINES) * plot.height) + 0.5;
      context.beginPath();
      context.moveTo(plot.left, lineY);
      context.lineTo(plot.left + plot.width, lineY);
      context.stroke();
      context.fillText(axisLabel(value), plot.left - 6, lineY);
    }
    context.textAlign = "center";
    context.textBaseline = "top";
    const minutes = Math.floor(this.windowSeconds / 60);
    for (let minute = 0; minute <= minutes; minute += 1) {
      const label = minute === 0 ? "now" : `-${minute} min`;
      context.fillText(label, Math.min(x(end - minute * 60), plot.left + plot.width - 12), plot.top + plot.height + 6);
    }
  }
}
