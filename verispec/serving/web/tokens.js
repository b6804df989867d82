// The verispec playground: the OpenAI stream and the colour-coded token view.
// Token origins come from the server (stream_options.include_provenance).
"use strict";

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
