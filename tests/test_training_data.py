"""Training data beyond the installed material: requests the target writes
itself (Magpie), and training on several runs' feature caches at once."""
from __future__ import annotations

import dataclasses
import json

import pytest

from conftest import tiny_target
from heads_support import tiny_prompts, tiny_settings
from verispec.bench.workloads import WORKLOADS, load_workload
from verispec.training import self_prompts as sp
from verispec.training.pipeline import run_pipeline


def _bench_texts() -> list[str]:
    return [m["content"] for w in WORKLOADS for p in load_workload(w) for m in p.messages]


def test_request_filter_refuses_bench_overlap_noise_and_repeats():
    keep = sp.RequestFilter()
    bench = load_workload("creative")[0].messages[-1]["content"]
    run = " ".join(bench.split()[:sp.SHINGLE])
    assert not keep.accept(bench)
    assert not keep.accept(f"Please, {run.upper()}, but shorter.")  # case and framing
    assert not keep.accept("Tell me more")  # under four words
    assert not keep.accept("Write about \u4e2d\u6587\u5b57\u7b26\u4e32\u6d4b\u8bd5 please")
    assert not keep.accept("Summarize https://example.org for me please")
    assert keep.accept("How do I keep basil alive on a windowsill?")
    assert not keep.accept("how do I keep basil  alive on a windowsill?")  # same, renormalized
    assert keep.accept("Write a limerick about a tired accountant.")


class _ChatChars:
    """Characters as tokens, with a chat template, for a target that never ends a turn."""
    chat_template = "chars"

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def encode(self, text, add_special_tokens=False):
        return [ord(c) % 96 for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(32 + i % 90) for i in ids)


def test_a_target_that_never_ends_a_request_is_a_clear_error(tmp_path):
    target = tiny_target(1, layers=2)
    assert not target.eos_token_ids
    settings = sp.SelfPromptSettings(2, max_tokens=4, batch_size=4, attempts_per_prompt=3)
    with pytest.raises(ValueError, match=r"only 0 usable requests of 2 in 6 attempts"):
        sp.self_prompts(target, _ChatChars(), settings, tmp_path / "asks.jsonl")


def test_a_tokenizer_without_chat_template_is_refused(tmp_path):
    class Plain(_ChatChars):
        chat_template = None

    with pytest.raises(ValueError, match="chat template"):
        sp.turn_prefix(Plain())


def test_the_default_model_writes_usable_requests_and_they_are_cached(default_engine, tmp_path,
                                                                     monkeypatch):
    target, tokenizer = default_engine.target, default_engine.tokenizer
    path = tmp_path / "asks.jsonl"
    settings = sp.SelfPromptSettings(6, seed=3, max_tokens=48, batch_size=8)
    asks = sp.self_prompts(target, tokenizer, settings, path)
    texts = [a.messages[0]["content"] for a in asks]
    assert len(set(texts)) == 6 and len({a.id for a in asks}) == 6
    prefix = tokenizer.decode(sp.turn_prefix(tokenizer), skip_special_tokens=False)
    assert prefix.rstrip().endswith("user")  # the turn the model is asked to write
    bench, runs = _bench_texts(), sp.RequestFilter().bench
    for text in texts:
        assert 4 <= len(text.split()) and text not in bench
        assert sum(ch.isascii() for ch in text) >= 0.97 * len(text)  # a "café" may pass
        assert not runs & sp._shingles(text)
    assert [json.loads(line)["text"] for line in path.read_text().splitlines()] == texts

    def no_decoding(*args, **kwargs):
        raise AssertionError("cached requests must be read back, not generated")

    monkeypatch.setattr(sp, "decode_prompts", no_decoding)
    again = sp.self_prompts(target, tokenizer, dataclasses.replace(settings, count=4), path)
    assert again == asks[:4]


def test_extra_data_trains_on_another_runs_features_too(tiny, tmp_path):
    prompts = tiny_prompts(tiny.vocab_size)
    first = run_pipeline(tiny, prompts[:12], tiny_settings("eagle", tmp_path / "a",
                                                           tmp_path / "data-a", steps=2))
    second = tiny_settings("eagle", tmp_path / "b", tmp_path / "data-b", steps=2)
    alone = run_pipeline(tiny, prompts[12:], second)
    both = run_pipeline(tiny, prompts[12:], dataclasses.replace(
        second, out=tmp_path / "c", extra_data=(tmp_path / "data-a",)))
    t = both.config.training
    assert t["sequences"] == first.config.training["sequences"] + alone.config.training["sequences"]
    assert t["positions"] == first.config.training["positions"] + alone.config.training["positions"]
    assert t["extra_data"] == [str(tmp_path / "data-a")]
    with pytest.raises(ValueError, match="no cached responses"):
        run_pipeline(tiny, prompts, dataclasses.replace(
            second, out=tmp_path / "d", extra_data=(tmp_path / "nowhere",)))
    other = tiny_target(1, layers=4)
    with pytest.raises(ValueError, match="other weights"):
        run_pipeline(other, prompts, dataclasses.replace(
            tiny_settings("eagle", tmp_path / "e", tmp_path / "data-e", steps=2),
            extra_data=(tmp_path / "data-a",)))
    # A cache kept for other layers gets this head's features from its responses.
    fused = run_pipeline(tiny, prompts[12:], dataclasses.replace(
        second, out=tmp_path / "f", data=tmp_path / "data-f", fused=True,
        extra_data=(tmp_path / "data-a",)))
    assert fused.config.training["positions"] == t["positions"]
    assert len(list((tmp_path / "data-a").glob("features-*"))) == 2


def test_self_written_and_built_prompts_interleave_in_proportion():
    from verispec.training.cli import interleave

    mixed = interleave(list(range(100)), list("abcdefghijklmnopqrstuvwxyz"))
    assert sorted(x for x in mixed if isinstance(x, int)) == list(range(100))
    assert [x for x in mixed if isinstance(x, str)] == list("abcdefghijklmnopqrstuvwxyz")
    for end in range(10, len(mixed) + 1):
        ints = sum(isinstance(x, int) for x in mixed[:end])
        assert abs(ints / end - 100 / 126) < 0.1, end
    assert interleave([1, 2], []) == [1, 2] and interleave([], [3]) == [3]


def test_train_head_refuses_a_foreign_data_dir_before_writing_prompts(default_model, tmp_path):
    """The data dir is claimed before the target writes any request: minutes of
    self-prompting must not precede a settings mismatch."""
    from verispec.cli import build_parser

    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.json").write_text(json.dumps({"target": "other", "seed": 0}))
    args = build_parser().parse_args(["train-head", "--type", "eagle", "--target", default_model,
                                      "--out", str(tmp_path / "o"),
                                      "--data", str(data), "--self-prompts", "1",
                                      "--tokens", "1000", "--no-progress"])
    with pytest.raises(ValueError, match="other settings"):
        args.func(args)
    assert not list(data.glob("self-prompts-*"))
    args.self_prompts = 1.5
    with pytest.raises(ValueError, match=r"share in \[0, 1\]"):
        args.func(args)
