"""`verispec warm-suffix`: the cache it writes holds exactly the target's own answers to
the requests (what serving them would have taught the store), appends to an existing
cache, stops at its token budget, keeps the store's bound, and refuses bad input with
one line."""
from __future__ import annotations

import json
from collections import Counter

import pytest
from ray_support import small_model_dir

from verispec import Engine, SamplingParams, SpecConfig
from verispec.cli.main import main
from verispec.proposers.suffix_store import SuffixStore

REQUESTS = ["Tell me about rivers.", "Write a haiku about snow.", "How do magnets work?"]
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return small_model_dir(tmp_path_factory)


@pytest.fixture()
def prompt_file(tmp_path):
    path = tmp_path / "traffic.jsonl"
    path.write_text("".join(json.dumps({"prompt": text}) + "\n" for text in REQUESTS))
    return path


def _warm(model_dir, prompt_file, cache, *extra: str) -> int:
    # fp32 with --batch-invariant: a batched row is bit-identical to the same row alone,
    # so the batched answers can be compared token for token with plain decoding.
    return main(["warm-suffix", "--model", str(model_dir), "--prompts", str(prompt_file),
                 "--suffix-cache", str(cache), "--max-new-tokens", str(NEW_TOKENS),
                 "--dtype", "fp32", "--batch-invariant", "--sampled-share", "0",
                 "--no-progress", *extra])


def _stored(cache) -> list[tuple[int, ...]]:
    store = SuffixStore()
    store.load(str(cache))
    return [tuple(s) for s in store.sequences()]


def test_cache_holds_the_targets_own_answers_and_grows(model_dir, prompt_file, tmp_path, capsys):
    cache = tmp_path / "store.npz"
    assert _warm(model_dir, prompt_file, cache) == 0
    engine = Engine(str(model_dir), dtype="fp32", batch_invariant=True)
    plain = [tuple(engine.generate(engine.encode(text, chat=True),
                                   SamplingParams(max_new_tokens=NEW_TOKENS),
                                   SpecConfig("none")).token_ids) for text in REQUESTS]
    # Answers are stored as they finish, so compare as multisets.
    assert Counter(_stored(cache)) == Counter(plain)
    assert "3 answers" in capsys.readouterr().err
    assert _warm(model_dir, prompt_file, cache) == 0  # a second run adds after the first
    assert Counter(_stored(cache)) == Counter(plain * 2)


def test_token_budget_and_store_bound(model_dir, prompt_file, tmp_path):
    budget = tmp_path / "budget.npz"
    # One request at a time: the budget is met after the first answer.
    assert _warm(model_dir, prompt_file, budget, "--tokens", "1", "--batch", "1") == 0
    assert len(_stored(budget)) == 1
    bounded = tmp_path / "bounded.npz"
    assert _warm(model_dir, prompt_file, bounded, "--suffix-max-tokens", str(NEW_TOKENS)) == 0
    kept = _stored(bounded)
    assert len(kept) == 1 and len(kept[0]) <= NEW_TOKENS  # the oldest answers were evicted


def test_bad_input_is_one_line(model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt field"}\n')
    cache = tmp_path / "store.npz"
    assert main(["warm-suffix", "--model", str(model_dir), "--prompts", str(bad),
                 "--suffix-cache", str(cache), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("verispec warm-suffix: error: --prompts:") and "messages" in err[-1]
    assert main(["warm-suffix", "--model", str(model_dir), "--prompts", str(bad)]) == 2
    assert "needs --suffix-cache" in capsys.readouterr().err
    assert main(["warm-suffix", "--material", "4", "--kinds", "poems", "--suffix-cache",
                 str(cache)]) == 2
    assert "unknown kind" in capsys.readouterr().err
    assert not cache.exists()


def test_material_prompts_of_the_asked_kinds(model_dir, tmp_path, capsys):
    cache = tmp_path / "material.npz"
    assert main(["warm-suffix", "--model", str(model_dir), "--material", "20", "--kinds",
                 "chat,creative", "--suffix-cache", str(cache), "--max-new-tokens", "4",
                 "--dtype", "fp32", "--no-progress"]) == 0
    # build_prompts(20) gives 6 chat and 6 creative prompts (KIND_SHARES 0.3 each).
    assert "12 answers" in capsys.readouterr().err
    assert len(_stored(cache)) == 12 and all(len(s) <= 4 for s in _stored(cache))


@pytest.mark.parametrize("flag,value", [("--suffix-cache", "store.npz"),
                                        ("--suffix-max-tokens", "1000")])
def test_ray_serving_refuses_one_shared_store(flag, value, capsys):
    """Ray replicas each keep their own store, so neither flag can mean what it says."""
    assert main(["serve", "--ray", flag, value]) == 2
    err = capsys.readouterr().err
    assert f"{flag} needs one server process" in err and len(err.strip().splitlines()) == 1
