// The verispec playground. Plain browser JavaScript, no build step, no outside requests.
// Token origins come from the server's stream (stream_options.include_provenance);
// every economics number comes from /playground/api/economics: this file only draws.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { info: null, live: null, econTimer: null, econSeq: 0, econ: null };

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}
const fmt = (x, d = 2) => (x === null || x === undefined || Number.isNaN(x) ? "–" : Number(x).toFixed(d));
const pct = (x) => (x === null || Number.isNaN(x) ? "–" : (100 * x).toFixed(1) + "%");
const shown = (text) => JSON.stringify(text);

// ---- tabs ---------------------------------------------------------------
function showTab(name) {
  if (!["live", "race", "economics"].includes(name)) name = "live";
  document.querySelectorAll(".tabs a").forEach((a) => a.classList.toggle("active", a.dataset.tab === name));
  document.querySelectorAll(".view").forEach((v) => { v.hidden = v.dataset.view !== name; });
  $("controls").hidden = name === "economics";
  if (name === "economics" && !state.econ) requestEconomics();
}
window.addEventListener("hashchange", () => showTab(location.hash.slice(1)));
document.querySelectorAll(".tabs a").forEach((a) => a.addEventListener("click", () => showTab(a.dataset.tab)));

// ---- server info and the shared controls ---------------------------------
async function loadInfo() {
  const res = await fetch("/playground/api/info");
  const info = await res.json();
  state.info = info;
  $("model-info").textContent = `${info.model} · ${info.backend} · ${info.num_layers} layers`;
  const proposer = $("proposer");
  for (const name of info.proposers) proposer.append(new Option(name === "none" ? "none (plain)" : name, name));
  proposer.value = info.proposers.includes(info.defaults.proposer) ? info.defaults.proposer : "ngram";
  for (const d of info.drafts) $("draft").append(new Option(d, d));
  $("draft").value = info.defaults.draft || info.drafts[Math.floor(info.drafts.length / 2)] || "";
  $("k").max = Math.min(16, info.k_max);
  $("k").value = Math.min(info.defaults.k, 16);
  $("k-auto").checked = false;
  $("tree").value = info.defaults.tree;
  if (!info.chat) { $("chat").checked = false; $("chat-wrap").hidden = true; }
  syncControls();
}

function syncControls() {
  $("k-out").textContent = $("k-auto").checked ? "auto" : $("k").value;
  $("k").disabled = $("k-auto").checked;
  $("temperature-out").textContent = Number($("temperature").value).toFixed(2);
  $("draft-wrap").hidden = $("proposer").value !== "draft";
  $("spec-desc").textContent = describeSpec();
}
["k", "k-auto", "temperature", "proposer", "tree"].forEach((id) => $(id).addEventListener("input", syncControls));

function describeSpec() {
  const p = $("proposer").value;
  if (p === "none") return "proposer none: the same as plain";
  const k = $("k-auto").checked ? "auto" : $("k").value;
  const tree = Number($("tree").value) > 0 ? `, tree ${$("tree").value}` : "";
  return `${p}${p === "draft" ? " " + $("draft").value : ""}, k ${k}${tree}`;
}

function speculation(plain) {
  const proposer = plain ? "none" : $("proposer").value;
  const spec = { proposer };
  if (proposer === "draft") spec.draft = $("draft").value;
  if (proposer !== "none") {
    spec.k = $("k-auto").checked ? "auto" : Number($("k").value);
    spec.tree = Number($("tree").value);
  }
  return spec;
}

function request({ plain = false, greedy = false } = {}) {
  const chat = $("chat").checked && state.info.chat;
  const prompt = $("prompt").value;
  const body = {
    model: state.info.model, max_tokens: Number($("max-tokens").value),
    temperature: greedy ? 0 : Number($("temperature").value),
    stream: true, stream_options: { include_provenance: true }, speculation: speculation(plain),
  };
  if (chat) body.messages = [{ role: "user", content: prompt }];
  else body.prompt = prompt;
  return { url: chat ? "/v1/chat/completions" : "/v1/completions", body, chat };
}

function showError(message) {
  $("error").hidden = !message;
  $("error").textContent = message || "";
}

// ---- the OpenAI stream, read as server-sent events ----------------------
async function streamCompletion(req, onChoice, signal) {
  const res = await fetch(req.url, {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(req.body), signal,
  });
  if (!res.ok) {
    let message = `${res.status} ${res.statusText}`;
    try { message = (await res.json()).error.message; } catch (_) { /* not JSON */ }
    throw new Error(message);
  }
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        for (const choice of chunk.choices) {
          const delta = req.chat ? (choice.delta && choice.delta.content) || "" : choice.text || "";
          onChoice(delta, choice);
        }
      }
    }
  }
}

// ---- colour-coded tokens and the per-pass strip --------------------------
class TokenView {
  constructor(box, strip, info) {
    this.box = box; this.strip = strip; this.info = info;
    this.reset();
    const hover = (ev) => this.hover(ev);
    box.addEventListener("mouseover", hover);
    if (strip) strip.addEventListener("mouseover", hover);
    box.addEventListener("mouseleave", () => this.unhover());
    if (strip) strip.addEventListener("mouseleave", () => this.unhover());
  }

  reset() {
    this.box.replaceChildren();
    if (this.strip) this.strip.replaceChildren();
    this.steps = [];
    this.counts = { accepted: 0, recovered: 0, bonus: 0 };
    this.plainTokens = 0;
    this.drafted = 0; this.accepted = 0; this.tokens = 0; this.text = "";
  }

  add(prov, tree) {
    const step = this.steps.length + 1;
    this.steps.push(prov);
    this.drafted += prov.drafted;
    this.accepted += prov.accepted;
    const plain = prov.drafted === 0;
    const frag = document.createDocumentFragment();
    prov.tokens.forEach((token, i) => {
      if (i === prov.accepted && prov.rejected.length) {
        const rej = el("s", "rej", prov.rejected.map((r) => r.text).join(tree ? "|" : ""));
        rej.dataset.step = step;
        rej.title = `pass ${step}: drafts the target rejected`;
        frag.append(rej);
      }
      const span = el("span", "tok " + (plain ? "plain" : token.origin), token.text);
      span.dataset.step = step;
      span.dataset.origin = token.origin;
      span.title = this.describe(step, prov, token);
      frag.append(span);
      this.counts[token.origin] += 1;
      if (plain) this.plainTokens += 1;
      this.tokens += 1;
      this.text += token.text;
    });
    const atBottom = this.box.scrollHeight - this.box.scrollTop - this.box.clientHeight < 30;
    this.box.append(frag);
    if (atBottom) this.box.scrollTop = this.box.scrollHeight;
    if (this.strip) this.addColumn(step, prov);
  }

  describe(step, prov, token) {
    const what = { accepted: "accepted draft", recovered: "recovered: the target's own token at the rejection",
                   bonus: prov.drafted ? "bonus: every draft passed, one more token from the same pass" : "plain step: nothing drafted" }[token.origin];
    const rejected = prov.rejected.length ? `; rejected ${prov.rejected.map((r) => shown(r.text)).join(" ")}` : "";
    return `${shown(token.text)}: ${what} (pass ${step}: k ${prov.k}, drafted ${prov.drafted}, accepted ${prov.accepted}${rejected})`;
  }

  addColumn(step, prov) {
    const col = el("div", "pass");
    col.dataset.step = step;
    const emitted = prov.tokens.length;
    const cells = [];
    for (let i = 0; i < Math.min(prov.accepted, emitted); i++) cells.push("a");
    let recovered = false;
    if (emitted > prov.accepted) {
      const origin = prov.tokens[emitted - 1].origin;
      recovered = origin === "recovered";
      cells.push(prov.drafted === 0 ? "p" : recovered ? "r" : "b");
    }
    const discarded = Math.max(0, prov.drafted - prov.accepted - (recovered ? 1 : 0));
    for (let i = 0; i < Math.min(discarded, 24); i++) cells.push("d");
    for (const c of cells) col.append(el("i", c));
    col.title = `pass ${step}: k ${prov.k}, drafted ${prov.drafted}, accepted ${prov.accepted}, emitted ${emitted}`;
    this.strip.append(col);
    this.strip.scrollLeft = this.strip.scrollWidth;
  }

  hover(ev) {
    const target = ev.target.closest("[data-step]");
    if (!target) return;
    this.unhover();
    const step = target.dataset.step;
    const root = this.box.closest(".card") || document;
    root.querySelectorAll(`[data-step="${step}"]`).forEach((n) => n.classList.add("hl"));
    const prov = this.steps[step - 1];
    if (this.info && prov) {
      const toks = prov.tokens.map((t) => `${shown(t.text)}:${t.origin}`).join(" ");
      const rej = prov.rejected.length ? `  rejected ${prov.rejected.map((r) => shown(r.text)).join(" ")}` : "";
      this.info.textContent = `pass ${step} · k ${prov.k} · drafted ${prov.drafted} · accepted ${prov.accepted} →  ${toks}${rej}`;
    }
  }

  unhover() {
    const root = this.box.closest(".card") || document;
    root.querySelectorAll(".hl").forEach((n) => n.classList.remove("hl"));
  }
}

// ---- Live ----------------------------------------------------------------
function liveStats(view, started, final) {
  const seconds = (performance.now() - started) / 1000;
  $("st-tau").textContent = view.steps.length ? fmt(view.tokens / view.steps.length) : "–";
  $("st-acc").textContent = view.drafted ? pct(view.accepted / view.drafted) : "–";
  $("st-tps").textContent = seconds > 0 && view.tokens ? fmt(view.tokens / seconds, 1) : "–";
  $("st-passes").textContent = view.steps.length || "–";
  const c = view.counts;
  $("st-origins").textContent = `${c.accepted} · ${c.recovered} · ${c.bonus - view.plainTokens} · ${view.plainTokens}`;
  $("st-origins").dataset.counts = JSON.stringify({ ...c, plain: view.plainTokens });
  if (final) {  // the server's own statistics for the finished request
    $("st-tau").textContent = fmt(final.tau);
    $("st-acc").textContent = final.drafted ? pct(final.acceptance_rate) : "–";
    $("st-passes").textContent = final.target_forwards;
    $("live-stats").dataset.server = JSON.stringify(final);
  }
}

async function runLive() {
  showError("");
  const view = state.live;
  view.reset();
  $("live-stats").dataset.server = "";
  $("live-out").dataset.done = "false";
  $("strip-note").textContent = "";
  const controller = new AbortController();
  state.liveAbort = controller;
  $("live-run").disabled = true; $("live-stop").disabled = false;
  $("live-out").classList.add("streaming");
  const req = request();
  const tree = Number($("tree").value) > 0;
  const started = performance.now();
  let content = "";
  try {
    await streamCompletion(req, (delta, choice) => {
      content += delta;
      if (choice.provenance) view.add(choice.provenance, tree);
      liveStats(view, started, choice.speculation);
      if (choice.finish_reason) $("strip-note").textContent = `finished: ${choice.finish_reason}`;
    }, controller.signal);
    $("live-out").dataset.content = content;
    $("live-out").dataset.done = "true";
  } catch (err) {
    if (err.name !== "AbortError") showError(err.message);
    else $("strip-note").textContent = "stopped";
  } finally {
    $("live-run").disabled = false; $("live-stop").disabled = true;
    $("live-out").classList.remove("streaming");
  }
}

// ---- Race ----------------------------------------------------------------
async function runLane(lane, plain) {
  const box = lane.querySelector(".lane-text");
  lane.view = lane.view || new TokenView(box, null, null);
  const view = lane.view;
  view.reset();
  lane.querySelector(".time").textContent = "running…";
  lane.querySelector(".meta").textContent = "";
  const req = request({ plain, greedy: true });
  box.classList.add("streaming");
  const started = performance.now();
  let content = "";
  let final = null;
  try {
    await streamCompletion(req, (delta, choice) => {
      content += delta;
      if (choice.provenance) view.add(choice.provenance, Number($("tree").value) > 0);
      if (choice.speculation) final = choice.speculation;
      lane.querySelector(".time").textContent = ((performance.now() - started) / 1000).toFixed(2) + " s";
    });
  } finally {
    box.classList.remove("streaming");
  }
  const seconds = (performance.now() - started) / 1000;
  const passes = final ? final.target_forwards : view.steps.length;
  lane.querySelector(".meta").textContent =
    `${view.tokens} tokens · ${passes} target passes · ${fmt(view.tokens / seconds, 1)} tok/s` +
    (final && final.drafted ? ` · acceptance ${pct(final.acceptance_rate)}` : "");
  lane.dataset.content = content;
  return { content, seconds, tokens: view.tokens };
}

const median = (xs) => { const s = [...xs].sort((a, b) => a - b); const m = s.length >> 1; return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2; };

async function runRace() {
  showError("");
  const verdict = $("race-verdict");
  verdict.hidden = false;
  verdict.className = "verdict running";
  delete verdict.dataset.same;
  const lanes = { plain: $("lane-plain"), spec: $("lane-spec") };
  Object.values(lanes).forEach((l) => {
    l.classList.remove("winner");
    l.querySelector(".lane-text").replaceChildren();
    l.querySelector(".time").textContent = "–";
    l.querySelector(".meta").textContent = "";
    l.querySelector(".lane-runs").textContent = "";
  });
  $("race-run").disabled = true;
  const rounds = Number($("race-rounds").value);
  const runs = { plain: [], spec: [] };
  try {
    for (let i = 0; i < rounds; i++) {
      // Alternate who goes first, so neither side always runs on a warmer machine.
      for (const side of i % 2 ? ["spec", "plain"] : ["plain", "spec"]) {
        verdict.textContent = `round ${i + 1} of ${rounds}: ${side === "plain" ? "plain decoding" : "speculation"}…`;
        runs[side].push(await runLane(lanes[side], side === "plain"));
        const times = runs[side].map((r) => r.seconds);
        lanes[side].querySelector(".time").textContent = median(times).toFixed(2) + " s";
        lanes[side].querySelector(".lane-runs").textContent = rounds > 1
          ? `median of ${times.length}: ${times.map((t) => t.toFixed(2)).join(", ")} s` : "";
        lanes[side].dataset.seconds = median(times);
      }
    }
    const texts = new Set([...runs.plain, ...runs.spec].map((r) => r.content));
    const same = texts.size === 1;
    verdict.dataset.same = String(same);
    const plain = median(runs.plain.map((r) => r.seconds));
    const spec = median(runs.spec.map((r) => r.seconds));
    const ratio = plain / spec;
    (ratio >= 1 ? lanes.spec : lanes.plain).classList.add("winner");
    const tokens = runs.spec[0].tokens;
    if (same) {
      verdict.className = "verdict same";
      verdict.textContent = `✓ identical: the same ${tokens} tokens, character for character` +
        (rounds > 1 ? ` in all ${2 * rounds} runs` : "") + `. Speculation took ${spec.toFixed(2)} s against ` +
        `${plain.toFixed(2)} s: ` + (ratio >= 1 ? `${ratio.toFixed(2)}× faster.` : `${(1 / ratio).toFixed(2)}× slower.`);
    } else {
      const a = runs.plain[0].content, b = runs.spec.find((r) => r.content !== a) || runs.plain.find((r) => r.content !== a);
      let i = 0;
      while (i < a.length && a[i] === b.content[i]) i++;
      verdict.className = "verdict differ";
      verdict.textContent = `✗ the texts differ from character ${i}: that is a bug, please report it.`;
    }
  } catch (err) {
    verdict.className = "verdict differ";
    verdict.textContent = "the race failed: " + err.message;
  } finally {
    $("race-run").disabled = false;
  }
}

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

// ---- wiring --------------------------------------------------------------
function init() {
  state.live = new TokenView($("live-out"), $("strip"), $("hover-info"));
  $("live-run").addEventListener("click", runLive);
  $("live-stop").addEventListener("click", () => state.liveAbort && state.liveAbort.abort());
  $("race-run").addEventListener("click", runRace);
  $("show-rejected").addEventListener("change", (e) => $("live-out").classList.toggle("hide-rejected", !e.target.checked));
  $("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) runLive(); });
  econInputs.forEach((id) => $(id).addEventListener("input", scheduleEconomics));
  document.querySelectorAll("#econ-proposer button").forEach((b) =>
    b.addEventListener("click", () => { $("cost").value = b.dataset.cost; scheduleEconomics(); }));
  document.querySelectorAll(".presets button").forEach((b) => b.addEventListener("click", () => preset(b.dataset.preset)));
  $("reroll").addEventListener("click", () => { econSeed += 1; requestEconomics(); });
  econOutputs();
  showTab(location.hash.slice(1));
  loadInfo().catch((err) => showError("could not reach the server: " + err.message));
}
init();
