"""The playground's server side: the provenance stream extension, the economics
endpoint and the page's static files, against a live server on loopback over a
tiny random model."""
from __future__ import annotations

import http.client
import json
import re
from pathlib import Path

import pytest
from conftest import tiny_engine

from verispec import SamplingParams, SpecConfig
from verispec.bench import calculator, econ_cli, simulate
from verispec.metrics import StepRecord
from verispec.policy import economics
from verispec.serving import playground
from verispec.serving.protocol import ServeDefaults
from verispec.serving.provenance import ChoiceProvenance
from verispec.serving.server import ServerConfig, ServerThread, create_app

PLAIN = SpecConfig("none", k=0)
ORIGINS = {"accepted", "recovered", "bonus"}


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


@pytest.fixture(scope="module")
def server(engine):
    config = ServerConfig(("tiny",), ServeDefaults(proposer="ngram", k=6, adaptive=False,
                                                   allowed_drafts=("same",)))
    with ServerThread(create_app(engine, config)) as srv:
        yield srv


def request(server, method: str, path: str, body: dict | None = None):
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    conn.request(method, path, body=None if body is None else json.dumps(body),
                 headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read().decode()
    conn.close()
    return response, data


def sse(text: str) -> list[dict]:
    assert text.endswith("data: [DONE]\n\n")
    events = [e for e in text.split("\n\n") if e]
    return [json.loads(e[len("data: "):]) for e in events[:-1]]


def stream(server, prompt: str, speculation: dict, max_tokens: int = 40, provenance: bool = True,
           **extra) -> list[dict]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "speculation": speculation, **extra}
    if provenance:
        body["stream_options"] = {"include_provenance": True}
    response, text = request(server, "POST", "/v1/completions", body)
    assert response.status == 200, text
    return sse(text)


def provenance_of(chunks: list[dict]) -> tuple[str, list[dict], dict]:
    """Streamed text, the provenance objects in order, and the final speculation."""
    text, steps, final = "", [], None
    for chunk in chunks:
        for choice in chunk["choices"]:
            text += choice["text"]
            if "provenance" in choice:
                steps.append(choice["provenance"])
            final = choice.get("speculation", final)
    return text, steps, final


CASES = [  # (prompt, speculation): between them every origin occurs
    ("abcabcabcabcab", {"proposer": "ngram", "k": 4}),
    ("the the the", {"proposer": "draft", "draft": "same", "k": 3}),
    ("zzzzzzzz", {"proposer": "draft", "draft": "self:1", "k": 5}),
    ("qwerty qwerty", {"proposer": "ngram", "k": 4, "tree": 8}),
    ("hello", {"proposer": "none"}),
]


@pytest.mark.parametrize("prompt,speculation", CASES)
def test_provenance_adds_up_and_decodes_to_plain_greedy(engine, server, prompt, speculation):
    want = engine.generate(prompt, SamplingParams(max_new_tokens=40), PLAIN)
    text, steps, final = provenance_of(stream(server, prompt, speculation))
    tokens = [t for step in steps for t in step["tokens"]]
    assert text == want.text
    assert [t["id"] for t in tokens] == want.token_ids
    assert "".join(t["text"] for t in tokens) == want.text
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1))
    assert len(steps) == final["target_forwards"]
    assert sum(s["drafted"] for s in steps) == final["drafted"]
    assert sum(s["accepted"] for s in steps) == final["accepted"]
    counts = {o: sum(t["origin"] == o for t in tokens) for o in ORIGINS}
    # No stop inside a block here (length finish): each pass is its accepted drafts plus
    # exactly one recovered or bonus token, so the counts add up to the stats.
    assert counts["accepted"] == final["accepted"]
    assert counts["recovered"] + counts["bonus"] == final["target_forwards"]
    assert sum(counts.values()) == len(want.token_ids)
    for step in steps:
        origins = [t["origin"] for t in step["tokens"]]
        assert origins[:-1] == ["accepted"] * step["accepted"]
        last = origins[-1]
        if speculation.get("tree"):
            assert last == "bonus" or step["rejected"]
            continue
        # Chain: a rejection leaves drafted - accepted rejected drafts; the first of them
        # is what the target refused at that position (greedy: not its argmax).
        assert len(step["rejected"]) == step["drafted"] - step["accepted"]
        assert (last == "bonus") == (not step["rejected"])
        if last == "recovered":
            assert step["rejected"][0]["id"] != step["tokens"][-1]["id"]


def test_every_origin_occurs(server):
    seen = set()
    for prompt, speculation in CASES:
        _, steps, _ = provenance_of(stream(server, prompt, speculation))
        seen |= {t["origin"] for s in steps for t in s["tokens"] if s["drafted"]}
    assert seen == ORIGINS


def test_same_model_draft_is_all_bonus(server):
    _, steps, final = provenance_of(stream(server, "the the the", {"proposer": "draft",
                                                                   "draft": "same", "k": 3}))
    assert final["acceptance_rate"] == 1.0
    assert all(s["tokens"][-1]["origin"] == "bonus" and not s["rejected"] for s in steps)


def test_sampled_provenance_adds_up(server):
    chunks = stream(server, "lorem ipsum lorem ipsum", {"proposer": "ngram", "k": 4},
                    max_tokens=48, temperature=1.0, seed=3)
    text, steps, final = provenance_of(chunks)
    tokens = [t for s in steps for t in s["tokens"]]
    assert "".join(t["text"] for t in tokens) == text
    assert sum(t["origin"] == "accepted" for t in tokens) == final["accepted"]
    assert len(steps) == final["target_forwards"] and len(tokens) == 48


def test_stream_without_the_extension_is_unchanged(server):
    """Dropping the provenance objects (and the chunks that carried only them)
    from an extended stream gives the plain stream, field for field."""
    speculation = {"proposer": "ngram", "k": 4}
    plain = stream(server, "abcabcabcab", speculation, provenance=False)
    extended = stream(server, "abcabcabcab", speculation)
    assert not any("provenance" in c for chunk in plain for c in chunk["choices"])
    stripped = []
    for chunk in extended:
        choices = [{k: v for k, v in c.items() if k != "provenance"} for c in chunk["choices"]]
        if any(c["text"] or c["finish_reason"] for c in choices):
            stripped.append({**chunk, "choices": choices})
    keyed = lambda chunks: [{k: v for k, v in c.items() if k not in ("id", "created")} for c in chunks]
    assert keyed(stripped) == keyed(plain)


def test_provenance_option_is_validated(server):
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 4, "stream": True,
            "stream_options": {"include_provenance": "yes"}}
    response, text = request(server, "POST", "/v1/completions", body)
    assert response.status == 400 and "include_provenance" in text
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 4,
            "stream_options": {"include_provenance": True}}
    response, text = request(server, "POST", "/v1/completions", body)
    assert response.status == 400 and "stream" in text
    # Token texts would run ahead of the text held back for a partial stop string.
    body = {"model": "tiny", "prompt": "abc", "max_tokens": 4, "stream": True, "stop": ["x"],
            "stream_options": {"include_provenance": True}}
    response, text = request(server, "POST", "/v1/completions", body)
    assert response.status == 400 and "stop" in text and "include_provenance" in text


class ByteTokenizer:
    """Token i is byte i: multi-byte characters span several tokens."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_token_texts_hold_split_characters():
    text = "añ€b"
    ids = list(text.encode())
    prov = ChoiceProvenance(ByteTokenizer().decode)
    record = StepRecord("ngram", k=len(ids) - 1, drafted=len(ids) - 1, accepted=len(ids) - 1,
                        emitted=len(ids), bonus=True)
    out = prov.step(record, ids, final=True)
    pieces = [t["text"] for t in out["tokens"]]
    assert "".join(pieces) == text
    assert pieces == ["a", "", "ñ", "", "", "€", "b"]
    assert [t["origin"] for t in out["tokens"]] == ["accepted"] * 6 + ["bonus"]


def test_rejected_drafts_are_recorded_by_the_engine(engine):
    """The engine's own step records carry the drafts the verifier discarded."""
    spec = SpecConfig("draft", k=5, draft="self:1")
    result = engine.generate("zzzzzzzz", SamplingParams(max_new_tokens=30), spec)
    steps = result.stats.steps
    assert any(s.rejected for s in steps)
    for s in steps:
        assert len(s.rejected) == s.drafted - s.accepted
        assert s.bonus == (not s.rejected)


# -- economics -------------------------------------------------------------

def economics_call(server, **params):
    query = "&".join(f"{k}={v}" for k, v in params.items())
    response, text = request(server, "GET", f"/playground/api/economics?{query}")
    return response.status, json.loads(text)


@pytest.mark.parametrize("alpha,k,cost,overhead", [(0.75, 4, 0.12, 0.0), (0.35, 10, 0.12, 0.0),
                                                   (0.35, 10, 0.01, 0.0), (0.9, 6, 0.05, 0.1)])
def test_economics_endpoint_is_verispec_economics(server, capsys, alpha, k, cost, overhead):
    status, got = economics_call(server, alpha=alpha, k=k, draft_cost=cost, verify_overhead=overhead)
    assert status == 200
    model = economics.CostModel(draft_cost=cost, verify_overhead=overhead)
    assert got["expected_tokens"] == calculator.expected_tokens(alpha, k)
    assert got["expected_speedup"] == calculator.expected_speedup(alpha, k, model)
    assert got["pass_cost"] == model.pass_cost(k)
    best = calculator.optimal_k(alpha, model, 16)
    assert (got["optimal_k"], got["optimal_speedup"]) == (best.k, best.speedup)
    assert [p["speedup"] for p in got["curve"]] == [calculator.expected_speedup(alpha, j, model)
                                                     for j in range(17)]
    run = simulate.simulate(alpha, k, 24, 0, model)
    assert got["simulation"]["tokens_per_pass"] == run.tokens_per_pass
    assert sum(got["simulation"]["round_tokens"]) / 24 == run.tokens_per_pass
    assert [r["std"] for r in got["spread"]] == [
        r.std for r in simulate.spread_by_rounds(alpha, k, trials=playground.SPREAD_TRIALS)]
    # ... and what `verispec calc --json` prints for the same inputs.
    assert econ_cli.main(["calc", "--alpha", str(alpha), "--k", str(k), "--draft-cost", str(cost),
                          "--verify-overhead", str(overhead), "--k-max", "16", "--json"]) == 0
    calc = json.loads(capsys.readouterr().out)
    for key in ("expected_tokens", "expected_speedup", "optimal_k", "optimal_speedup", "ceiling"):
        assert got[key] == calc[key]


def test_seed_experiment_presets(server):
    """Seed 000: alpha 0.35 at k 10 with a draft model is slower than plain
    decoding; n-gram's near-zero draft cost brings the gain back."""
    _, start = economics_call(server, alpha=0.75, k=4, draft_cost=0.12, verify_overhead=0)
    assert start["optimal_k"] == 4 and round(start["expected_speedup"], 2) == 2.06
    assert round(start["expected_tokens"], 2) == 3.05
    _, slow = economics_call(server, alpha=0.35, k=10, draft_cost=0.12, verify_overhead=0)
    _, ngram = economics_call(server, alpha=0.35, k=10, draft_cost=0.01, verify_overhead=0)
    assert slow["expected_speedup"] < 1 < ngram["expected_speedup"]


@pytest.mark.parametrize("params,word", [({"alpha": 1.0}, "alpha"), ({"alpha": 0.5, "k": -1}, "k"),
                                         ({"alpha": 0.5, "draft_cost": -1}, "draft_cost"),
                                         ({"alpha": 0.5, "k_max": 99}, "k_max"),
                                         ({"alpha": 0.5, "k": 33}, "k"),
                                         ({"alpha": 0.5, "rounds": 10**7}, "rounds")])
def test_economics_refuses_bad_values(server, params, word):
    status, body = economics_call(server, **params)
    assert status == 400 and word in body["error"]["message"]


# -- the page --------------------------------------------------------------

def test_page_root_redirect_and_assets(server):
    response, html = request(server, "GET", "/")
    assert response.status == 307 and response.getheader("location") == "/playground"
    response, html = request(server, "GET", "/playground")
    assert response.status == 200 and response.getheader("content-type").startswith("text/html")
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets and all(a.startswith(("/playground/", "#", "data:")) for a in assets), assets
    for asset in (a for a in assets if a.startswith("/playground/static/")):
        response, body = request(server, "GET", asset)
        assert response.status == 200 and body
        # No CDN, no font service: nothing on the page names another host.
        assert not re.search(r"https?://(?!www\.w3\.org/2000/svg)", body), asset
    response, info = request(server, "GET", "/playground/api/info")
    info = json.loads(info)
    assert info["model"] == "tiny" and "ngram" in info["proposers"] and info["chat"] is False


def test_page_ships_in_the_package():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert re.search(r'"verispec\.serving" = \[[^\]]*"web/\*"', pyproject)
    web = Path(playground.__file__).with_name("web")
    assert {p.name for p in web.iterdir()} >= {"index.html", "app.js", "style.css"}


def test_root_is_left_alone_when_taken(engine):
    from fastapi import FastAPI

    app = FastAPI()
    app.get("/")(lambda: {"mine": True})
    config = ServerConfig(("tiny",))
    playground.mount(app, engine, config)
    with ServerThread(app) as srv:
        response, body = request(srv, "GET", "/")
    assert response.status == 200 and json.loads(body) == {"mine": True}

