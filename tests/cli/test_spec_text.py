"""One parser for what users type about speculation (verispec.spec_text): every
edge (generate flags, bench tokens, serve defaults, the HTTP `speculation`
object) reads the same text the same way, and the CLI accepts what it used to
refuse."""
from __future__ import annotations

import json

import pytest
from conftest import tiny_engine

from verispec.bench.configs import proposer_spec
from verispec.cli.args import spec_from
from verispec.cli.main import build_parser, main
from verispec.config import DEFAULT_SPEC, SamplingParams, SpecConfig
from verispec.serving.protocol import APIError, ServeDefaults, parse_request, serve_defaults
from verispec.serving.protocol import parse_spec as request_spec
from verispec.spec_text import DRAFT_SOURCES, SpecError, parse_spec, parse_token


def generate_args(*flags):
    return build_parser().parse_args(["generate", "--prompt", "x", *flags])


def http_spec(body: dict, defaults: ServeDefaults, num_layers: int) -> SpecConfig:
    """A request's speculation through the server's validation and parser."""
    request = parse_request({"model": "m", "prompt": "p", **body}, chat=False)
    return request_spec(request.speculation, defaults, num_layers)


def test_one_text_one_config_at_every_edge():
    want = SpecConfig("draft", k=6, adaptive=True, draft="self:8")
    assert spec_from(generate_args("--proposer", "self:8", "--k-max", "6")) == want
    assert proposer_spec("self:8+auto", 6, None) == want
    served = serve_defaults(build_parser().parse_args(["serve", "--proposer", "self:8",
                                                       "--k-max", "6"]))
    assert (served.proposer, served.draft, served.k, served.adaptive) == ("draft", "self:8", 6, True)
    assert http_spec({"speculation": {"proposer": "self:8"}}, served, num_layers=30) == want
    assert http_spec({"speculation": {"proposer": "draft", "draft": "self:8", "k": "auto"}},
                     ServeDefaults(k=6, adaptive=False), num_layers=30) == want


def test_tree_and_k_spellings_agree():
    assert proposer_spec("ngram+tree=16", 5, None) == SpecConfig("ngram", k=5, tree=16)
    assert spec_from(generate_args("--tree", "16", "--k", "5")) == SpecConfig("ngram", k=5, tree=16)
    assert proposer_spec("ngram+tree=k", 6, None) == SpecConfig("ngram", k=6, tree=6)
    assert parse_token("ngram+tree=k", {"k": 6}) == SpecConfig("ngram", k=6, tree=6)
    with pytest.raises(SpecError, match="--tree takes a whole number or k"):
        parse_spec(proposer="ngram", k=5, tree="auto")
    # Adaptive k is the default: the CLI's and the API's default configurations agree.
    assert spec_from(generate_args()) == DEFAULT_SPEC
    assert DEFAULT_SPEC.adaptive and DEFAULT_SPEC.proposer == "ngram"
    fixed = spec_from(generate_args("--k", "4"))
    assert fixed.k == 4 and not fixed.adaptive
    assert parse_spec(proposer="none", k="auto", tree=4) == SpecConfig("none", k=0)


@pytest.mark.parametrize("typed, field", [
    ({"k": "many"}, "k"), ({"tree": "wide"}, "tree"), ({"proposer": "magic"}, "proposer"),
    ({"proposer": "self:x"}, "draft"), ({"proposer": "draft"}, "draft"),
    ({"proposer": "ngram", "head": "runs/h"}, "head"), ({"k": -1}, "k"),
    ({"tree_shape": "wide", "tree": 4}, "tree_shape"), ({"colour": "red"}, "colour"),
])
def test_errors_name_the_field(typed, field):
    with pytest.raises(SpecError) as exc:
        parse_spec(typed)
    assert exc.value.field == field


def test_http_errors_point_at_the_speculation_field():
    defaults = ServeDefaults()
    for raw, param in (({"proposer": "self:99"}, "speculation.draft"),
                       ({"proposer": "nope"}, "speculation.proposer"),
                       ({"tree": -2}, "speculation.tree")):
        with pytest.raises(APIError) as exc:
            http_spec({"speculation": raw}, defaults, num_layers=4)
        assert exc.value.param == param


def test_a_new_draft_source_works_everywhere(monkeypatch):
    """Adding a draft source is one table entry: it then works as --proposer and
    --draft on the command line and as a bench token."""
    def check(rest):
        if not rest.startswith("Q"):
            raise SpecError(f"quant: needs a block format, got {rest!r}", "draft")

    monkeypatch.setitem(DRAFT_SOURCES, "quant", check)
    assert spec_from(generate_args("--proposer", "quant:Q4_0:8")).draft == "quant:Q4_0:8"
    assert spec_from(generate_args("--proposer", "draft", "--draft", "quant:Q8_0")).draft == "quant:Q8_0"
    assert proposer_spec("quant:Q4_0+auto", 4, None).draft == "quant:Q4_0"
    with pytest.raises(SpecError, match="block format"):
        proposer_spec("quant:F99", 4, None)
    with pytest.raises(SpecError, match="block format"):
        spec_from(generate_args("--proposer", "draft", "--draft", "quant:F99"))


def run_json(capsys, *argv) -> dict:
    assert main(["generate", "--json", "--max-new-tokens", "24", *argv]) == 0
    return json.loads(capsys.readouterr().out)


PROMPT = ["--model", "default",
          "--prompt", "List the days of the week: Monday, Tuesday, Wednesday, Monday, Tuesday,"]


def test_cli_accepts_what_it_used_to_refuse(default_model, capsys):
    """`generate --proposer self:8`, torch's dtype names and `--proposer auto --tree
    8` all run on the default model, with output equal to plain decoding."""
    plain = run_json(capsys, *PROMPT, "--proposer", "none", "--dtype", "fp32")
    alias = run_json(capsys, *PROMPT, "--proposer", "none", "--dtype", "float32")
    assert (alias["token_ids"], alias["text"]) == (plain["token_ids"], plain["text"])
    selfdraft = run_json(capsys, *PROMPT, "--proposer", "self:8", "--dtype", "float32")
    assert selfdraft["token_ids"] == plain["token_ids"]
    assert selfdraft["stats"]["proposer"] == "draft:self:8" and selfdraft["stats"]["drafted"] > 0
    auto = run_json(capsys, *PROMPT, "--proposer", "auto", "--tree", "8", "--dtype", "float32")
    assert auto["token_ids"] == plain["token_ids"] and auto["stats"]["adaptive"]
    bf16 = run_json(capsys, *PROMPT, "--proposer", "none", "--dtype", "bf16")
    assert run_json(capsys, *PROMPT, "--proposer", "none",
                    "--dtype", "bfloat16")["token_ids"] == bf16["token_ids"]


def test_cli_refuses_a_bad_draft_source_with_one_line(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--prompt", "hi", "--proposer", "self:none"])
    assert exc.value.code == 2
    assert "self:L needs a whole number of layers" in capsys.readouterr().err


def test_auto_with_a_tree_drafts_trees():
    """`auto` with a tree budget: both of its lookups draft trees of that budget, and the
    output stays plain decoding's."""
    engine = tiny_engine()
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6]
    spec = parse_spec(proposer="auto", tree=8, k="auto", k_max=4)
    got = engine.generate(prompt, SamplingParams(max_new_tokens=16), spec)
    want = engine.generate(prompt, SamplingParams(max_new_tokens=16), SpecConfig("none", k=0))
    assert got.token_ids == want.token_ids
    request = engine.new_request(prompt, SamplingParams(max_new_tokens=16), spec)
    assert request.proposer.ngram.tree_nodes == request.proposer.suffix.tree_nodes == 8
