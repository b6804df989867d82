"""The HF backend's fp32 LM head for half-precision models: kept whole when small, cast
slice by slice when large, and the same logits either way."""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_llama

from verispec import Engine, SamplingParams, SpecConfig
from verispec.models import hf
from verispec.models.hf import HFModel
from verispec.step.lossless import compare_greedy

PROMPT = [3, 17, 4, 9, 3, 17, 4, 9, 3, 17, 4, 22, 5]


def _logits_and_reference(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    target = HFModel(model)
    cache = target.new_cache()
    got = target.forward(torch.tensor(PROMPT), cache).logits  # [n, vocab]
    with torch.inference_mode():
        hidden = model.model(input_ids=torch.tensor([PROMPT])).last_hidden_state[0]
    want = torch.nn.functional.linear(hidden.float(), model.lm_head.weight.float())
    return got, want


def test_small_head_is_one_fp32_matmul():
    got, want = _logits_and_reference(tiny_llama(0, dtype=torch.bfloat16))
    assert got.dtype == torch.float32
    assert torch.equal(got, want)
    # bf16 logits would sit on a grid of bf16 values; fp32 ones do not.
    assert not torch.equal(got, got.bfloat16().float())


def test_large_head_is_cast_in_slices(monkeypatch):
    # 64-wide hidden state: 4 KiB holds 16 vocabulary rows, so the 128-row head takes 8 slices.
    monkeypatch.setattr(hf, "FP32_HEAD_BYTES", 4096)
    got, want = _logits_and_reference(tiny_llama(0, dtype=torch.bfloat16))
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("head_bytes", [hf.FP32_HEAD_BYTES, 4096])
def test_sliced_head_keeps_speculation_lossless(monkeypatch, head_bytes):
    monkeypatch.setattr(hf, "FP32_HEAD_BYTES", head_bytes)
    target = HFModel(tiny_llama(0, dtype=torch.bfloat16))
    engine = Engine(target)
    sampling = SamplingParams(max_new_tokens=24)
    want = engine.generate(PROMPT, sampling, SpecConfig("none", k=0))
    got = engine.generate(PROMPT, sampling, SpecConfig("ngram", k=4))
    comparison = compare_greedy(target, PROMPT, want.token_ids, got.token_ids)
    assert comparison.identical, comparison.describe()
