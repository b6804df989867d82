// The verispec playground: the economics widget. Every number comes from
// /playground/api/economics (verispec's calc and simulate); this file only draws.
"use strict";

// ---- Economics -----------------------------------------------------------
const econInputs = ["alpha", "ek", "cost", "overhead"];
let econSeed = 0;

function econOutputs() {
  $("alpha-out").textContent = Number($("alpha").value).toFixed(2);
  $("ek-out").textContent = $("ek").value;
  $("cost-out").textContent = Number($("cost").value).toFixed(2);
  $("overhead-out").textContent = Number($("overhead").value).toFixed(2);
  const cost = Number($("cost").value).toFixed(2);
  let active = null;
  document.querySelectorAll("#econ-proposer button").forEach((b) => {
    const on = Number(b.dataset.cost).toFixed(2) === cost;
    b.classList.toggle("on", on);
    if (on) active = b;
  });
  $("econ-proposer-hint").textContent = {
    draft: "A small model of the same family: the best acceptance, but every draft token costs a real forward.",
    eagle: "Heads trained on the target's hidden states: cheap drafts, good acceptance, one training per model.",
    ngram: "Prompt lookup copies what followed the current suffix before: almost free, good when the output repeats the input.",
  }[active ? active.dataset.name : ""] || "A custom draft cost.";
}

function scheduleEconomics() {
  econOutputs();
  clearTimeout(state.econTimer);
  state.econTimer = setTimeout(requestEconomics, 60);
}

async function requestEconomics() {
  econOutputs();
  const seq = ++state.econSeq;
  const params = new URLSearchParams({
    alpha: $("alpha").value, k: $("ek").value, draft_cost: $("cost").value,
    verify_overhead: $("overhead").value, k_max: 16, rounds: 24, seed: econSeed,
  });
  const res = await fetch("/playground/api/economics?" + params);
  const data = await res.json();
  if (seq !== state.econSeq) return;  // a newer request is under way
  if (!res.ok) { $("preset-note").textContent = data.error.message; return; }
  state.econ = data;
  renderEconomics(data);
}

function renderEconomics(r) {
  const sim = r.simulation;
  $("ro-measured").textContent = fmt(sim.tokens_per_pass);
  $("ro-theory").textContent = fmt(r.expected_tokens);
  $("ro-rounds").textContent = sim.rounds;
  const speed = $("ro-speedup");
  speed.textContent = fmt(r.expected_speedup) + "×";
  speed.dataset.value = r.expected_speedup;
  speed.parentElement.classList.toggle("bad", r.expected_speedup < 1);
  $("ro-speedup-measured").textContent = fmt(sim.speedup) + "×";
  $("ro-best").textContent = `${r.optimal_k} (${fmt(r.optimal_speedup)}×)`;
  $("ro-best").dataset.k = r.optimal_k;
  $("ro-best").dataset.speedup = r.optimal_speedup;
  drawCurve(r);
  drawRounds(r);
  drawSpread(r);
  const note = $("preset-note");
  note.textContent = r.expected_speedup < 1
    ? `Slower than plain decoding: a pass with ${r.k} drafts costs ${fmt(r.pass_cost)} decode steps and returns ${fmt(r.expected_tokens)} tokens. Try n-gram, or k = ${r.optimal_k}.`
    : `${fmt(r.expected_speedup)}× over plain decoding; the best k here is ${r.optimal_k}.`;
}

function svg(tag, attrs, text) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function drawCurve(r) {
  const box = $("curve");
  box.replaceChildren();
  const W = 640, H = 260, L = 44, R = 48, T = 18, B = 34;
  const pts = r.curve;
  const kMax = pts[pts.length - 1].k;
  const sMax = Math.max(1.25, ...pts.map((p) => p.speedup)) * 1.1;
  const eMax = Math.max(2, ...pts.map((p) => p.expected_tokens)) * 1.1;
  const x = (k) => L + (k / kMax) * (W - L - R);
  const ys = (s) => H - B - (s / sMax) * (H - T - B);
  const ye = (e) => H - B - (e / eMax) * (H - T - B);
  const step = sMax > 4 ? 1 : sMax > 2 ? 0.5 : 0.25;
  for (let s = 0; s <= sMax; s += step) {
    box.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: ys(s), y2: ys(s) }));
    box.append(svg("text", { x: L - 6, y: ys(s) + 4, "text-anchor": "end" }, s.toFixed(2).replace(/0$/, "") + "×"));
  }
  for (let k = 0; k <= kMax; k += 2) box.append(svg("text", { x: x(k), y: H - B + 16, "text-anchor": "middle" }, k));
  box.append(svg("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" }, "draft length k"));
  const eStep = eMax > 8 ? 2 : 1;
  for (let e = 0; e <= eMax; e += eStep) box.append(svg("text", { x: W - R + 6, y: ye(e) + 4 }, e));
  box.append(svg("text", { x: W - 4, y: T - 6, "text-anchor": "end", fill: "#2b9348" }, "E[tokens / pass]"));
  box.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  box.append(svg("line", { class: "even", x1: L, x2: W - R, y1: ys(1), y2: ys(1) }));
  box.append(svg("text", { x: W - R - 4, y: ys(1) - 5, "text-anchor": "end", fill: "#d0454c" }, "plain decoding"));
  box.append(svg("polyline", { class: "tokens-line", points: pts.map((p) => `${x(p.k)},${ye(p.expected_tokens)}`).join(" ") }));
  box.append(svg("polyline", { class: "speed", points: pts.map((p) => `${x(p.k)},${ys(p.speedup)}`).join(" ") }));
  box.append(svg("text", { x: L + 4, y: T - 6, fill: "#3b5bdb", class: "lbl" }, "expected speedup"));
  const best = pts[r.optimal_k];
  box.append(svg("circle", { class: "opt", cx: x(best.k), cy: ys(best.speedup), r: 7, "data-k": best.k }));
  box.append(svg("text", { class: "optlbl", x: x(best.k), y: ys(best.speedup) - 12, "text-anchor": "middle" },
    `best k = ${best.k}`));
  if (r.k <= kMax) {
    const cur = pts[r.k];
    box.append(svg("circle", { class: "cur", cx: x(cur.k), cy: ys(cur.speedup), r: 4.5 }));
    box.append(svg("text", { x: x(cur.k) + 8, y: ys(cur.speedup) + 16, class: "lbl", fill: "#3b5bdb" },
      `k = ${cur.k}: ${fmt(cur.speedup)}×`));
  }
}

function drawRounds(r) {
  const box = $("rounds");
  box.replaceChildren();
  const k = r.k;
  r.simulation.round_tokens.forEach((tokens) => {
    const row = el("div", "round");
    const accepted = tokens - 1;
    for (let i = 0; i < accepted; i++) row.append(el("i", "a"));
    if (accepted < k) {
      row.append(el("i", "r"));
      for (let i = accepted + 1; i < k; i++) row.append(el("i", "d"));
    } else {
      row.append(el("i", "b"));
    }
    row.append(el("span", null, `${tokens}`));
    box.append(row);
  });
}

function drawSpread(r) {
  const table = $("spread");
  table.replaceChildren();
  const head = el("tr");
  ["rounds", "mean tokens/pass", "measured spread (std)", "theory std", ""].forEach((h) => head.append(el("th", null, h)));
  table.append(head);
  const top = Math.max(...r.spread.map((row) => Math.max(row.std, row.theoretical_std)), 1e-9);
  for (const row of r.spread) {
    const tr = el("tr");
    tr.append(el("td", null, row.rounds), el("td", null, fmt(row.mean, 3)), el("td", null, fmt(row.std, 3)),
      el("td", null, fmt(row.theoretical_std, 3)));
    const cell = el("td", "bar-cell");
    const bar = el("div");
    bar.style.width = `${(100 * row.std) / top}%`;
    const mark = el("b");
    mark.style.left = `${(100 * row.theoretical_std) / top}%`;
    bar.append(mark);
    cell.append(bar);
    tr.append(cell);
    table.append(tr);
  }
  $("spread-note").textContent = `Each row repeats a run of that many rounds ${r.spread_trials} times. ` +
    `A ${r.simulation.rounds}-round benchmark measured ${fmt(r.simulation.tokens_per_pass)} tokens per pass against ` +
    `${fmt(r.expected_tokens)} in theory; the spread (bars, theory in orange) shrinks like 1/√rounds. ` +
    "Speculation improves the mean latency and slightly worsens its variance.";
}

function preset(name) {
  const set = (id, v) => { $(id).value = v; };
  if (name === "seed") { set("alpha", 0.75); set("ek", 4); set("cost", 0.12); set("overhead", 0); }
  if (name === "slow") { set("alpha", 0.35); set("ek", 10); set("cost", 0.12); }
  if (name === "ngram") set("cost", 0.01);
  scheduleEconomics();
}
