// The page: health warnings, the plot grid, the trajectory browser and the config, from the inlined data.
"use strict";

function showWarnings(data) {
  const box = document.getElementById("warning-list");
  if (!data.warnings.length) {
    box.append(h("div", { class: "healthy" }, "No health warning fired."));
    return;
  }
  for (const w of data.warnings) box.append(h("div", { class: "warning" }, h("b", {}, `${w.name} (from step ${w.step}): `), w.message));
}

function showLedger(data) {
  const box = document.getElementById("ledger-list");
  if (!data.ledger.length) box.append(h("div", { class: "hint" }, "No step trained yet."));
  for (const line of data.ledger) box.append(h("div", {}, line));
}

function showPlots(data, browser) {
  const grid = new PlotGrid(data.metrics, step => browser.show(step));
  const root = document.getElementById("grid");
  for (const p of data.panels) grid.add(root.appendChild(h("div", { class: "panel" })), p.title, p.left, p.right, p.warning, data.labels);
  // one more panel: any logged metric
  const keys = Object.keys(data.metrics.series).filter(k => !k.startsWith("health/warning/"));
  const panel = root.appendChild(h("div", { class: "panel" }));
  const chooser = select("pick-metric", keys.map(k => [k, k]), keys.includes("actor/pg_loss") ? "actor/pg_loss" : keys[0], v => {
    plot.left = [v]; plot.title = v; grid.draw(plot);
  });
  panel.append(h("label", { class: "hint" }, "any metric: ", chooser));
  const plot = grid.add(panel, chooser.value || "no metrics", chooser.value ? [chooser.value] : [], [], null, {});
  browser.onStep = step => grid.pick(step);
  return grid;
}

function showConfig(data) {
  const diff = document.getElementById("diff");
  if (data.preset) {
    diff.append(h("p", {}, `Differences from the preset closest to this run, conf/${data.preset}.yaml (${data.diff.length}):`));
    const table = h("table", {}, h("tr", {}, h("th", {}, "key"), h("th", {}, "preset"), h("th", {}, "this run")));
    for (const [k, a, b] of data.diff) table.append(h("tr", {}, h("td", {}, k), h("td", {}, JSON.stringify(a)), h("td", {}, JSON.stringify(b))));
    diff.append(table);
  }
  const table = document.getElementById("config-table");
  const rows = Object.entries(data.config).map(([k, v]) => {
    const tr = h("tr", {}, h("td", {}, k), h("td", {}, JSON.stringify(v)));
    table.append(tr);
    return [k, tr];
  });
  document.getElementById("config-filter").addEventListener("input", evt => {
    const q = evt.target.value.toLowerCase();
    rows.forEach(([k, tr]) => { tr.hidden = !k.toLowerCase().includes(q); });
  });
}

function main() {
  const data = JSON.parse(document.getElementById("report-data").textContent);
  document.getElementById("title").textContent = data.title;
  const steps = data.metrics.steps;
  document.getElementById("subtitle").textContent =
    `ColoRL run report · ${steps.length ? "steps " + steps[0] + "–" + steps[steps.length - 1] : "no step logged yet"} · written ${data.written}`;
  showWarnings(data);
  showLedger(data);
  const browser = new Browser(data, {
    controls: document.getElementById("controls"),
    legend: document.getElementById("legend"),
    list: document.getElementById("sample-list"),
  });
  showPlots(data, browser);
  browser.render();
  showConfig(data);
}

document.addEventListener("DOMContentLoaded", main);
