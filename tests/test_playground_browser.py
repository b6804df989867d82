"""The playground page in a real headless browser (Debian's chromium, driven by
Playwright's Python API) against a live server on loopback over a tiny random
model: Live, Race and Economics, no console errors, nothing fetched off the host."""
from __future__ import annotations

import http.client
import json
import os
import re

import pytest

from conftest import CharTokenizer, tiny_engine
from verispec.bench import econ_cli
from verispec.serving.protocol import ServeDefaults
from verispec.serving.scheduler import SchedulerConfig
from verispec.serving.server import ServerConfig, ServerThread, create_app

CHROMIUM = os.environ.get("VERISPEC_CHROMIUM", "/usr/bin/chromium")
# Never `playwright install`: it downloads a browser. These flags keep Debian's
# chromium off the network and quiet in a container.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
TIMEOUT_MS = 120_000


class ChatCharTokenizer(CharTokenizer):
    """A chat template, so the page's chat path (delta.content) runs too."""
    chat_template = "test"

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return self.encode("".join(f"[{m['role']}]{m['content']}" for m in messages) + "[assistant]")


@pytest.fixture(scope="module")
def server():
    config = ServerConfig(("tiny",), ServeDefaults(proposer="ngram", k=6, adaptive=False,
                                                   allowed_drafts=("same",)))
    with ServerThread(create_app(tiny_engine(ChatCharTokenizer()), config)) as srv:
        yield srv


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"no browser at {CHROMIUM}: scripts/install.sh installs Debian's chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


class Page:
    """A fresh page on the playground that records console errors and every
    request, and refuses any that leaves the server."""

    def __init__(self, browser, server, tab: str) -> None:
        self.origin = server.url
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.set_default_timeout(TIMEOUT_MS)
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(f"{server.url}/playground#{tab}")
        self.page.wait_for_function("document.querySelectorAll('#proposer option').length > 0")

    def _route(self, route) -> None:
        url = route.request.url
        self.requests.append(url)
        if url.startswith(self.origin + "/") or url.startswith("data:"):
            route.continue_()
        else:
            route.abort()

    def set_value(self, selector: str, value) -> None:
        """Move a slider (or set any input) the way a user does: value, then an input event."""
        self.page.eval_on_selector(selector, "(e, v) => { e.value = v; e.dispatchEvent(new Event('input', {bubbles: true})); }",
                                   str(value))

    def close(self) -> None:
        offsite = [u for u in self.requests if not (u.startswith(self.origin + "/") or u.startswith("data:"))]
        self.context.close()
        assert not offsite, f"the page asked for {offsite}"
        assert not self.errors, f"console errors: {self.errors}"


def api(server, prompt: str, speculation: dict, max_tokens: int, chat: bool = False) -> tuple[str, dict]:
    """The text and speculation of the same request, non-streamed."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    body = {"model": "tiny", "max_tokens": max_tokens, "temperature": 0, "speculation": speculation}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    conn.request("POST", "/v1/chat/completions" if chat else "/v1/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    out = json.loads(conn.getresponse().read())
    conn.close()
    choice = out["choices"][0]
    return choice["message"]["content"] if chat else choice["text"], choice["speculation"]


def test_live_colours_each_token_by_its_origin(browser, server):
    page = Page(browser, server, "live")
    p = page.page
    prompt = "zzzzzzzz zzzz"
    p.fill("#prompt", prompt)
    p.select_option("#proposer", "draft")
    p.select_option("#draft", "self:1")
    page.set_value("#k", 4)
    p.fill("#max-tokens", "40")
    p.click("#live-run")
    p.wait_for_selector("#live-out[data-done=true]")
    spans = p.eval_on_selector_all(
        "#live-out .tok", "els => els.map(e => ({text: e.textContent, origin: e.dataset.origin, "
        "step: e.dataset.step, cls: e.className, bg: getComputedStyle(e).backgroundColor}))")
    assert p.is_checked("#chat")  # the model has a chat template: the page uses it
    text, speculation = api(server, prompt, {"proposer": "draft", "draft": "self:1", "k": 4}, 40,
                            chat=True)
    stats = json.loads(p.get_attribute("#live-stats", "data-server"))
    assert "".join(s["text"] for s in spans) == text
    assert p.get_attribute("#live-out", "data-content") == text
    assert stats == speculation
    origins = [s["origin"] for s in spans]
    assert origins.count("accepted") == stats["accepted"] > 0
    assert origins.count("recovered") > 0
    assert origins.count("recovered") + origins.count("bonus") == stats["target_forwards"]
    assert len({s["step"] for s in spans}) == stats["target_forwards"]
    # Three origins, three colours.
    colour = {s["cls"]: s["bg"] for s in spans}
    assert len(set(colour.values())) == len(colour) >= 2
    assert p.inner_text("#st-passes") == str(stats["target_forwards"])
    assert float(p.inner_text("#st-tau")) == pytest.approx(stats["tau"], abs=0.0051)
    assert p.locator("#strip .pass").count() == stats["target_forwards"]
    # Rejected drafts are struck through inline, and hovering a pass explains it.
    assert p.locator("#live-out s.rej").count() == origins.count("recovered")
    p.hover("#live-out .tok.recovered >> nth=0")
    assert re.search(r"pass \d+ .* rejected", p.inner_text("#hover-info"))
    p.uncheck("#show-rejected")
    assert not p.locator("#live-out s.rej >> nth=0").is_visible()
    page.close()


def test_race_shows_identical_texts_and_times(browser, server):
    page = Page(browser, server, "race")
    p = page.page
    prompt = "abcabcabcabc"
    p.fill("#prompt", prompt)
    p.select_option("#proposer", "ngram")
    page.set_value("#k", 5)
    p.fill("#max-tokens", "32")
    p.uncheck("#chat")  # a plain completion this time
    p.click("#race-run")
    p.wait_for_selector("#race-verdict[data-same]")
    assert p.get_attribute("#race-verdict", "data-same") == "true"
    assert "identical" in p.inner_text("#race-verdict") and "all 6 runs" in p.inner_text("#race-verdict")
    plain = p.get_attribute("#lane-plain", "data-content")
    spec = p.get_attribute("#lane-spec", "data-content")
    assert plain == spec == api(server, prompt, {"proposer": "none"}, 32)[0]
    for lane in ("#lane-plain", "#lane-spec"):
        assert re.fullmatch(r"\d+\.\d\d s", p.inner_text(f"{lane} .time"))
        assert re.fullmatch(r"median of 3: (\d+\.\d\d, ){2}\d+\.\d\d s", p.inner_text(f"{lane} .lane-runs"))
    assert "32 target passes" in p.inner_text("#lane-plain .meta")
    page.close()


def calc(alpha: float, k: int, cost: float, capsys) -> dict:
    assert econ_cli.main(["calc", "--alpha", str(alpha), "--k", str(k), "--draft-cost", str(cost),
                          "--verify-overhead", "0", "--k-max", "16", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_economics_widget_follows_verispec_calc(browser, server, capsys):
    page = Page(browser, server, "economics")
    p = page.page
    p.wait_for_selector("#ro-best[data-k]")
    assert p.inner_text("#ro-best").startswith("4 ")  # the seed's start: alpha 0.75, k 4
    speedup = lambda: float(p.get_attribute("#ro-speedup", "data-value"))
    # The seed's experiment: slower than plain decoding, then n-gram brings the gain back.
    p.click("button[data-preset=slow]")
    p.wait_for_function("Number(document.getElementById('ro-speedup').dataset.value) < 1")
    assert speedup() == pytest.approx(calc(0.35, 10, 0.12, capsys)["expected_speedup"], rel=1e-12)
    assert p.locator("#ro-speedup").evaluate("e => e.parentElement.classList.contains('bad')")
    p.click("button[data-preset=ngram]")
    p.wait_for_function("Number(document.getElementById('ro-speedup').dataset.value) > 1")
    assert speedup() == pytest.approx(calc(0.35, 10, 0.01, capsys)["expected_speedup"], rel=1e-12)
    assert "on" in p.get_attribute("#econ-proposer button[data-name=ngram]", "class")
    # Move the acceptance slider: the curve and its optimum follow `verispec calc`.
    before = p.get_attribute("#curve polyline.speed", "points")
    want = calc(0.9, 10, 0.01, capsys)
    page.set_value("#alpha", 0.9)
    p.wait_for_function(f"document.getElementById('ro-best').dataset.k === '{want['optimal_k']}'")
    assert p.get_attribute("#curve circle.opt", "data-k") == str(want["optimal_k"])
    assert float(p.get_attribute("#ro-best", "data-speedup")) == pytest.approx(want["optimal_speedup"])
    assert p.get_attribute("#curve polyline.speed", "points") != before
    assert p.locator("#rounds .round").count() == 24
    assert p.locator("#spread tr").count() == 6
    page.close()


def test_tabs_and_no_outside_requests(browser, server):
    page = Page(browser, server, "live")
    for tab in ("race", "economics", "live"):
        page.page.click(f"a[data-tab={tab}]")
        page.page.wait_for_selector(f"#view-{tab}", state="visible", timeout=5000)
        assert page.page.locator(".view:visible").count() == 1
        assert page.page.locator("#controls").is_visible() == (tab != "economics")
    page.page.wait_for_selector("#ro-best[data-k]", state="attached")
    assert all(u.startswith(server.url) for u in page.requests)
    page.close()


def test_default_model_live_and_race(browser, default_engine):
    """The real model: its chat template and byte-level BPE vocabulary, through the page."""
    # Fixed k: no cost curve needed, so skip the start-up timing of forwards.
    config = ServerConfig(("default",), ServeDefaults(proposer="ngram", k=8, adaptive=False),
                          SchedulerConfig(calibrate=False))
    with ServerThread(create_app(default_engine, config)) as srv:
        page = Page(browser, srv, "live")
        p = page.page
        p.fill("#max-tokens", "40")
        p.select_option("#proposer", "ngram")
        page.set_value("#k", 8)
        p.click("#live-run")
        p.wait_for_selector("#live-out[data-done=true]")
        spans = p.eval_on_selector_all("#live-out .tok", "els => els.map(e => e.textContent)")
        stats = json.loads(p.get_attribute("#live-stats", "data-server"))
        assert "".join(spans) == p.get_attribute("#live-out", "data-content")
        assert stats["accepted"] > 0  # the default prompt is a summary: n-gram finds copies
        p.click("a[data-tab=race]")
        p.select_option("#race-rounds", "1")
        p.click("#race-run")
        p.wait_for_selector("#race-verdict[data-same]")
        assert p.get_attribute("#race-verdict", "data-same") == "true"
        assert p.get_attribute("#lane-spec", "data-content") == "".join(spans)
        page.close()
