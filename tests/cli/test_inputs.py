"""Bad input gets a clear ValueError (API) or exit code 2 (CLI) and leaves
the engine usable; sampling is seeded."""
from __future__ import annotations

import pytest
from conftest import CharTokenizer, tiny_llama, tiny_target

from verispec import Engine, SamplingParams, SpecConfig
from verispec.cli.main import main


@pytest.fixture(scope="module")
def engine():
    return Engine(tiny_target(0, layers=2, max_positions=64), tokenizer=CharTokenizer())


@pytest.mark.parametrize("make, message", [
    (lambda: SpecConfig(k=-1), "k must be >= 0"),
    (lambda: SamplingParams(temperature=-0.5), "temperature"),
    (lambda: SamplingParams(top_p=0.0), "top_p"),
    (lambda: SamplingParams(top_p=1.5), "top_p"),
    (lambda: SamplingParams(top_k=-1), "top_k"),
    (lambda: SamplingParams(max_new_tokens=0), "max_new_tokens"),
    (lambda: SpecConfig(proposer="draft"), "needs a draft model"),
    (lambda: SpecConfig(ngram_min=3, ngram_max=2), "ngram_min"),
])
def test_bad_settings(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("prompt, sampling, spec, message", [
    ([], SamplingParams(), SpecConfig(), "empty"),
    ("", SamplingParams(), SpecConfig(), "empty"),
    ("   ", SamplingParams(), SpecConfig(), "empty"),
    ([1, 2, 999], SamplingParams(), SpecConfig(), r"token ids must be in \[0, 96\)"),
    (list(range(40)), SamplingParams(max_new_tokens=30), SpecConfig(), "70 exceeds .* 64"),
    ([1, 2], SamplingParams(max_new_tokens=8), SpecConfig(proposer="magic"), "unknown proposer 'magic'"),
    ([1, 2], SamplingParams(max_new_tokens=8), SpecConfig("draft", draft="self:9"), "self:L needs 1 <= L <= 2"),
    ([1, 2], SamplingParams(max_new_tokens=8), SpecConfig("draft", draft="self:x"), "whole number"),
    ([1, 2], SamplingParams(max_new_tokens=8), SpecConfig("draft", draft="/no/such/model"), "not found"),
])
def test_bad_requests_leave_engine_usable(engine, prompt, sampling, spec, message):
    with pytest.raises(ValueError, match=message):
        engine.generate(prompt, sampling, spec)
    ok = engine.generate([1, 2, 3], SamplingParams(max_new_tokens=5), SpecConfig("ngram", k=2))
    assert len(ok.token_ids) == 5


def test_k_zero_is_plain_decoding(engine):
    got = engine.generate([4, 5, 6], SamplingParams(max_new_tokens=10), SpecConfig("ngram", k=0))
    assert got.stats.drafted == 0 and got.stats.target_forwards == 10


def test_draft_with_other_vocabulary_is_refused(tmp_path, engine):
    tiny_llama(5, vocab=80).save_pretrained(tmp_path / "other")
    with pytest.raises(ValueError, match="different vocabulary"):
        engine.generate([1, 2], SamplingParams(max_new_tokens=4),
                        SpecConfig("draft", draft=str(tmp_path / "other")))
    assert engine.generate([1, 2], SamplingParams(max_new_tokens=4)).token_ids


def test_draft_model_from_a_local_directory(tmp_path, engine):
    """A draft given by path loads through the real loader (config + safetensors)."""
    tiny_llama(0, layers=2, max_positions=64).save_pretrained(tmp_path / "same")
    want = engine.generate([3, 4, 5], SamplingParams(max_new_tokens=12), SpecConfig("none", k=0))
    got = engine.generate([3, 4, 5], SamplingParams(max_new_tokens=12),
                          SpecConfig("draft", k=4, draft=str(tmp_path / "same")))
    assert got.token_ids == want.token_ids
    assert got.stats.accepted == got.stats.drafted > 0


def test_seeds(engine):
    sampling = SamplingParams(temperature=1.0, seed=7, max_new_tokens=20)
    for spec in (SpecConfig("ngram", k=3), SpecConfig("draft", k=3, draft="self:1"),
                 SpecConfig("none", k=0)):
        a = engine.generate([1, 2, 3], sampling, spec).token_ids
        b = engine.generate([1, 2, 3], sampling, spec).token_ids
        c = engine.generate([1, 2, 3], SamplingParams(temperature=1.0, seed=8,
                                                      max_new_tokens=20), spec).token_ids
        assert a == b and a != c


def test_sampled_draft_distribution_end_to_end():
    """The whole engine with a sampled draft model: the first emitted token
    follows the target's distribution (chi-square, 2000 seeded runs), while a
    draft that disagrees is drafted and often rejected."""
    import numpy as np
    import torch
    from scipy.stats import chisquare

    target = tiny_target(11, layers=1, vocab=8)
    draft = tiny_target(12, layers=1, vocab=8)
    eng = Engine(target)
    eng._drafts["d"] = draft
    prompt = [1, 2, 3]
    temp = 2.0  # flatten the peaked tiny model so every token has mass
    logits = target.forward(torch.tensor(prompt), target.new_cache()).logits[-1]
    want = (logits / temp).softmax(-1).double().numpy()
    runs = 2000
    counts = np.zeros(8)
    drafted = accepted = 0
    for seed in range(runs):
        got = eng.generate(prompt, SamplingParams(temperature=temp, seed=seed, max_new_tokens=2),
                           SpecConfig("draft", k=2, draft="d"))
        counts[got.token_ids[0]] += 1
        drafted += got.stats.drafted
        accepted += got.stats.accepted
    assert drafted == runs and 0.1 * runs < accepted < 0.9 * runs
    assert chisquare(counts, want / want.sum() * runs).pvalue > 1e-3


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv, message", [
    (["generate", "--prompt", "hi", "--k", "-1"], "k must be >= 0"),
    (["generate", "--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "--prompt", "hi", "--top-p", "0"], "top_p"),
    (["generate", "--prompt", "hi", "--top-k", "-3"], "top_k"),
    (["generate", "--prompt-file", "/no/such/file"], "cannot read --prompt-file"),
    (["generate"], "give a prompt"),
    (["generate", "--prompt", "hi", "--k", "many"], "--k takes a whole number or auto"),
    (["generate", "--prompt", "hi", "--model", "/no/such/dir"], "model path not found"),
])
def test_cli_errors_exit_2_with_one_line(capsys, argv, message):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_unknown_proposer_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "--prompt", "hi", "--proposer", "magic"])
    assert exc.value.code == 2
    assert "invalid choice: 'magic'" in capsys.readouterr().err
