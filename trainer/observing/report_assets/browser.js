// The trajectory browser: pick a step, filter its sampled responses, read them token by token.
"use strict";

const FILTERS = {
  all: ["every sample", () => true],
  best: ["best reward first", () => true],
  worst: ["worst reward first", () => true],
  clipped: ["clipped at the length limit", s => s.clipped],
  tools: ["tool errors", s => (s.tool_error_counts || 0) > 0],
  multiturn: ["tool calls", s => (s.tool_call_counts || 0) > 0],
};
const COLOURINGS = {
  trained: "trained (green) or masked (grey)",
  advantage: "advantage (blue +, red −)",
  log_prob: "log-prob of the sampled token (orange: unlikely)",
};

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") el.className = v; else if (k.startsWith("on")) el.addEventListener(k.slice(2), v); else el.setAttribute(k, v);
  }
  for (const c of children) if (c !== null && c !== undefined) el.append(c);
  return el;
}

function select(id, options, value, onChange) {
  const el = h("select", { id, onchange: () => onChange(el.value) });
  for (const [v, label] of options) el.append(h("option", { value: v }, label));
  el.value = value;
  return el;
}

class Browser {
  constructor(data, root) {
    this.data = data;
    this.root = root;
    const hash = new URLSearchParams(location.hash.slice(1));
    this.kind = hash.get("kind") || (Object.keys(data.samples.train).length ? "train" : "val");
    this.filter = FILTERS[hash.get("filter")] ? hash.get("filter") : "all";
    this.colour = COLOURINGS[hash.get("colour")] ? hash.get("colour") : "trained";
    const steps = this.steps();
    const asked = hash.get("step");
    this.step = asked === "all" ? "all" : asked !== null && steps.includes(+asked) ? +asked : steps[steps.length - 1];
    this.onStep = null;
  }

  steps() { return Object.keys(this.data.samples[this.kind] || {}).map(Number).sort((a, b) => a - b); }

  // the step with samples nearest to `step` (from a click on a plot)
  show(step) {
    const steps = this.steps();
    if (!steps.length) return;
    this.step = steps.reduce((a, b) => (Math.abs(b - step) < Math.abs(a - step) ? b : a));
    this.render();
  }

  render() {
    const { controls, legend, list } = this.root;
    controls.innerHTML = "";
    const steps = this.steps();
    controls.append(
      h("label", {}, "Responses of ", select("pick-kind", [["train", "training steps"], ["val", "validations"]], this.kind, v => {
        this.kind = v; const s = this.steps(); this.step = s[s.length - 1]; this.render();
      })),
      h("label", {}, "step ", select("pick-step", [["all", "all steps"], ...steps.map(s => [String(s), String(s)])], String(this.step), v => {
        this.step = v === "all" ? "all" : +v; this.render();
      })),
      h("button", { onclick: () => this.move(-1), title: "previous step" }, "◀"),
      h("button", { onclick: () => this.move(1), title: "next step" }, "▶"),
      h("label", {}, "show ", select("pick-filter", Object.entries(FILTERS).map(([k, v]) => [k, v[0]]), this.filter, v => { this.filter = v; this.render(); })),
      h("label", {}, "colour tokens by ", select("pick-colour", Object.entries(COLOURINGS), this.colour, v => { this.colour = v; this.render(); })),
    );
    legend.textContent = "Tokens: " + COLOURINGS[this.colour] + ". Grey turns are masked out of the loss (tool answers, the chat template around them); hover a token for its text, advantage and log-prob.";
    list.innerHTML = "";
    list.className = "mode-" + this.colour;
    const samples = this.samples();
    if (!samples.length) list.append(h("p", { class: "none" }, steps.length ? "No sample of this step matches the filter." : "No samples were written (trainer.report.samples_per_step=0, or no step has run yet)."));
    const scale = Math.max(1e-6, ...samples.flatMap(([, s]) => (s.advantages || []).map(Math.abs)));
    samples.forEach(([step, s], i) => list.append(this.card(step, s, i, scale)));
    if (this.onStep && this.step !== "all") this.onStep(this.step);
  }

  move(delta) {
    const steps = this.steps();
    const i = this.step === "all" ? steps.length - 1 : steps.indexOf(this.step);
    this.step = steps[Math.min(steps.length - 1, Math.max(0, i + delta))];
    this.render();
  }

  samples() {
    const byStep = this.data.samples[this.kind] || {};
    const steps = this.step === "all" ? this.steps() : [this.step];
    let out = steps.flatMap(step => (byStep[step] || []).map(s => [step, s]));
    out = out.filter(([, s]) => FILTERS[this.filter][1](s));
    if (this.filter === "best") out.sort((a, b) => b[1].reward - a[1].reward);
    if (this.filter === "worst") out.sort((a, b) => a[1].reward - b[1].reward);
    return out;
  }

  card(step, s, index, scale) {
    const trainedAdv = (s.advantages || []).filter((_, i) => s.trained && s.trained[i]);
    const meanAdv = trainedAdv.length ? trainedAdv.reduce((a, b) => a + b, 0) / trainedAdv.length : null;
    const head = h("div", { class: "head" },
      h("b", {}, `step ${step} · #${index + 1} · reward ${fmt(s.reward ?? s.score)}`),
      meanAdv !== null ? h("span", { class: "badge" }, "advantage " + fmt(meanAdv)) : null,
      h("span", { class: "badge" }, `${s.response_length ?? "?"} tokens`),
      s.clipped ? h("span", { class: "badge bad" }, "clipped at the length limit") : null,
      s.tool_call_counts ? h("span", { class: "badge tool" }, `${s.tool_call_counts} tool call(s)`) : null,
      s.tool_error_counts ? h("span", { class: "badge bad" }, `${s.tool_error_counts} tool error(s)`) : null,
      s.stop_reason ? h("span", { class: "badge" }, "stop: " + s.stop_reason) : null,
      s.data_source ? h("span", { class: "badge" }, s.data_source) : null,
      s.gts !== undefined && s.gts !== null ? h("span", { class: "badge" }, "ground truth: " + (typeof s.gts === "string" ? s.gts : JSON.stringify(s.gts))) : null,
    );
    const text = this.data.prompts[s.prompt] ?? "";
    const prompt = h("details", {}, h("summary", {}, "prompt"), h("div", { class: "prompt" }, text));
    if (text.length < 200) prompt.open = true;  // a short prompt is shown; a long one (a system message) folded
    const body = s.tokens ? this.turns(s, scale) : [h("div", { class: "turn" }, s.output || "")];
    const messages = s.messages && s.messages.length ? h("details", { class: "messages" }, h("summary", {}, `conversation (${s.messages.length} messages)`),
      ...s.messages.map(m => h("div", { class: "msg" }, h("b", {}, m.role), h("pre", {}, typeof m.content === "string" ? m.content : JSON.stringify(m.content))))) : null;
    return h("div", { class: "sample", "data-step": step }, head, prompt, ...body, messages);
  }

  // the response split into turns: runs of trained tokens (the model's) and of masked ones (tool answers)
  turns(s, scale) {
    const out = [];
    let current = null;
    s.tokens.forEach((tok, i) => {
      const trained = s.trained ? s.trained[i] === 1 : true;
      if (!current || current.trained !== trained) {
        current = { trained, el: h("div", { class: "turn " + (trained ? "model" : "tool") }, h("span", { class: "role" }, trained ? "model (trained)" : "tool / template (masked)")) };
        out.push(current);
      }
      current.el.append(this.token(s, i, tok, trained, scale));
    });
    return out.map(t => t.el);
  }

  token(s, i, text, trained, scale) {
    const adv = s.advantages ? s.advantages[i] : null, lp = s.log_probs ? s.log_probs[i] : null;
    const shown = text.replace(/\n/g, "↵\n");  // a newline token stays visible
    const span = h("span", { class: "tok " + (trained ? "trained" : "masked"), title: `${JSON.stringify(text)} · ${trained ? "trained" : "masked"} · advantage ${fmt(adv)} · log p ${fmt(lp)}` }, shown);
    if (trained && this.colour === "advantage" && adv !== null) {
      const a = Math.min(1, Math.abs(adv) / scale);
      span.style.background = adv >= 0 ? `rgba(30,100,220,${0.1 + 0.6 * a})` : `rgba(210,40,40,${0.1 + 0.6 * a})`;
    } else if (trained && this.colour === "log_prob" && lp !== null) {
      span.style.background = `rgba(245,124,0,${Math.min(1, -lp / 5) * 0.75})`;
    } else if (!trained && this.colour !== "trained") {
      span.style.background = "#e0e0e0";
    }
    return span;
  }
}
