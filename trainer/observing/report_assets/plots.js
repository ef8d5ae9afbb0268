// Interactive line plots in plain SVG: shared step zoom, hover values, warning bands, click to pick a step.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
const W = 520, H = 230, M = { l: 50, r: 50, t: 10, b: 26 };

function svgEl(tag, attrs, parent) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}

function niceTicks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const raw = (hi - lo) / count, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(f => f * mag).find(s => s >= raw);
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) ticks.push(+v.toPrecision(12));
  return ticks;
}

function fmt(v) {
  if (v === null || v === undefined) return "–";
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e5) ? v.toExponential(2) : +v.toPrecision(4) + "";
}

// The plots of the page: they share the metric columns, the zoom (view) and the picked step.
class PlotGrid {
  constructor(metrics, onPick) {
    this.steps = metrics.steps;
    this.series = metrics.series;
    this.onPick = onPick;
    this.plots = [];
    this.view = null;  // [lo, hi] steps, null: everything
    this.picked = null;
  }

  add(container, title, left, right, warning, labels) {
    const body = container.appendChild(document.createElement("div"));  // redrawn; the container keeps the rest
    const plot = { container: body, title, left, right, warning, labels: labels || {} };
    this.plots.push(plot);
    this.draw(plot);
    return plot;
  }

  setView(view) {
    this.view = view;
    const state = document.getElementById("zoom-state");
    if (state) state.textContent = view ? `Zoomed on steps ${view[0]}–${view[1]} (double-click a plot to zoom out)` : "";
    this.plots.forEach(p => this.draw(p));
  }

  pick(step) {
    this.picked = step;
    this.plots.forEach(p => this.draw(p));
  }

  visibleSteps() {
    const [lo, hi] = this.view || [this.steps[0], this.steps[this.steps.length - 1]];
    return [lo, hi];
  }

  points(key) {
    const values = this.series[key] || [], [lo, hi] = this.visibleSteps(), out = [];
    this.steps.forEach((s, i) => { if (values[i] !== null && values[i] !== undefined && s >= lo && s <= hi) out.push([s, values[i]]); });
    return out;
  }

  draw(plot) {
    const box = plot.container;
    box.innerHTML = "";
    const h = document.createElement("h3");
    h.textContent = plot.title;
    box.appendChild(h);
    const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, class: "plot" }, box);
    const legend = document.createElement("div");
    legend.className = "legend";
    box.appendChild(legend);
    const [lo, hi] = this.visibleSteps();
    const x = s => M.l + (hi > lo ? (s - lo) / (hi - lo) : 0.5) * (W - M.l - M.r);
    const drawn = [];
    const axes = [["left", plot.left, M.l], ["right", plot.right, W - M.r]];
    for (const [side, keys, ax] of axes) {
      const sets = keys.map(k => [k, this.points(k)]).filter(([, pts]) => pts.length);
      if (!sets.length) continue;
      const vals = sets.flatMap(([, pts]) => pts.map(p => p[1]));
      let ylo = Math.min(...vals), yhi = Math.max(...vals);
      if (ylo === yhi) { ylo -= Math.abs(ylo) * 0.1 || 1; yhi += Math.abs(yhi) * 0.1 || 1; }
      const pad = (yhi - ylo) * 0.06;
      ylo -= pad; yhi += pad;
      const y = v => M.t + (1 - (v - ylo) / (yhi - ylo)) * (H - M.t - M.b);
      const axis = svgEl("g", { class: "axis" }, svg);
      for (const t of niceTicks(ylo, yhi, 5)) {
        if (side === "left") svgEl("line", { x1: M.l, x2: W - M.r, y1: y(t), y2: y(t), class: "gridline" }, axis);
        const label = svgEl("text", { x: side === "left" ? ax - 4 : ax + 4, y: y(t) + 3, "text-anchor": side === "left" ? "end" : "start" }, axis);
        label.textContent = fmt(t);
      }
      for (const [key, pts] of sets) {
        const color = COLORS[drawn.length % COLORS.length];
        const d = pts.map((p, i) => `${i ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join("");
        svgEl("path", { d, fill: "none", stroke: color, "stroke-width": 1.4, "stroke-dasharray": side === "right" ? "5 3" : "", "data-key": key }, svg);
        if (pts.length < 40) pts.forEach(p => svgEl("circle", { cx: x(p[0]), cy: y(p[1]), r: 2.2, fill: color }, svg));
        drawn.push({ key, color, side, label: plot.labels[key] || key });
      }
    }
    const axis = svgEl("g", { class: "axis" }, svg);
    for (const t of niceTicks(lo, hi, 6).filter(t => Number.isInteger(t))) {
      const label = svgEl("text", { x: x(t), y: H - 8, "text-anchor": "middle" }, axis);
      label.textContent = t;
    }
    this.drawWarning(svg, plot, x);
    if (this.picked !== null && this.picked >= lo && this.picked <= hi)
      svgEl("line", { x1: x(this.picked), x2: x(this.picked), y1: M.t, y2: H - M.b, class: "selline" }, svg);
    if (!drawn.length) {
      const t = svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, svg);
      t.textContent = "not logged";
    }
    for (const d of drawn) {
      const item = document.createElement("span");
      item.innerHTML = `<i style="background:${d.color}"></i>`;
      item.appendChild(document.createTextNode(d.label + (d.side === "right" ? " (right axis)" : "")));
      legend.appendChild(item);
    }
    this.interact(svg, drawn, x, lo, hi);
  }

  drawWarning(svg, plot, x) {
    if (!plot.warning) return;
    const flags = this.points("health/warning/" + plot.warning);
    let first = null;
    for (let i = 0; i < flags.length; i++) {
      if (!flags[i][1]) continue;
      const start = flags[i][0];
      while (i + 1 < flags.length && flags[i + 1][1]) i++;
      const end = flags[i][0];
      svgEl("rect", { x: x(start) - 1, y: M.t, width: Math.max(x(end) - x(start), 0) + 2, height: H - M.t - M.b, class: "warnband", "data-warning": plot.warning }, svg);
      if (first === null) first = start;
    }
    if (first !== null) {
      svgEl("line", { x1: x(first), x2: x(first), y1: M.t, y2: H - M.b, class: "warnline" }, svg);
      const t = svgEl("text", { x: x(first) + 3, y: M.t + 10, fill: "#c62828", "font-size": 10 }, svg);
      t.textContent = "⚠ " + plot.warning + " (step " + first + ")";
    }
  }

  interact(svg, drawn, x, lo, hi) {
    const overlay = svgEl("rect", { x: M.l, y: M.t, width: W - M.l - M.r, height: H - M.t - M.b, fill: "transparent" }, svg);
    const hover = svgEl("line", { y1: M.t, y2: H - M.b, class: "hoverline", visibility: "hidden" }, svg);
    const brush = svgEl("rect", { y: M.t, height: H - M.t - M.b, class: "brush", visibility: "hidden" }, svg);
    const tip = document.getElementById("tooltip");
    const toStep = evt => {
      const r = svg.getBoundingClientRect(), px = (evt.clientX - r.left) * W / r.width;
      const s = lo + (px - M.l) / (W - M.l - M.r) * (hi - lo);
      return this.nearest(Math.min(hi, Math.max(lo, s)));
    };
    let down = null;
    overlay.addEventListener("mousedown", evt => { down = toStep(evt); });
    overlay.addEventListener("mousemove", evt => {
      const s = toStep(evt);
      hover.setAttribute("x1", x(s)); hover.setAttribute("x2", x(s)); hover.setAttribute("visibility", "visible");
      if (down !== null && s !== down) {
        brush.setAttribute("x", Math.min(x(s), x(down))); brush.setAttribute("width", Math.abs(x(s) - x(down)));
        brush.setAttribute("visibility", "visible");
      }
      const i = this.steps.indexOf(s);
      const rows = drawn.map(d => `<span style="color:${d.color}">■</span> ${d.label}: <b>${fmt(this.series[d.key][i])}</b>`);
      tip.innerHTML = `<b>step ${s}</b><br>` + rows.join("<br>");
      tip.hidden = false;
      tip.style.left = evt.clientX + 14 + "px"; tip.style.top = evt.clientY + 10 + "px";
    });
    overlay.addEventListener("mouseleave", () => { hover.setAttribute("visibility", "hidden"); tip.hidden = true; });
    overlay.addEventListener("mouseup", evt => {
      const s = toStep(evt), start = down;
      down = null;
      brush.setAttribute("visibility", "hidden");
      if (start !== null && s !== start) this.setView([Math.min(s, start), Math.max(s, start)]);
      else if (this.onPick) this.onPick(s);
    });
    overlay.addEventListener("dblclick", () => this.setView(null));
  }

  nearest(step) {
    let best = this.steps[0];
    for (const s of this.steps) if (Math.abs(s - step) < Math.abs(best - step)) best = s;
    return best;
  }
}
