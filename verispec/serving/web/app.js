// The verispec playground: tabs, the shared controls, Live and Race. Plain browser
// JavaScript in three files (tokens.js, economics.js, this one, loaded in that order),
// no build step, no outside requests.
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
