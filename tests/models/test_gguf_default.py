"""The embedded default model (a Q4_1 GGUF with a Q8_0 embedding) read as it is:
quantized logits bit-identical to today's dense bf16 path, its own tokenizer
and chat template, the --weights selection, and the integer path (quant-i8)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

from verispec import kernels
from verispec.models import loading

# The share of 300 positions where quant-i8's greedy token is the bf16 path's
# (measured: see docs/quant_kernels.md, "The integer path").
AGREEMENT = 0.95
PROMPT = ("The quick brown fox jumps over the lazy dog. " * 20
          + "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" * 4)


@pytest.fixture(scope="module")
def dense_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(loading.resolve_model_dir(None)), local_files_only=True)


def test_tokenizer_from_the_file_matches_the_dense_path(dense_tokenizer):
    tokenizer = loading.gguf_tokenizer(loading.default_gguf_path())
    assert tokenizer.get_vocab() == dense_tokenizer.get_vocab()
    assert tokenizer.chat_template == dense_tokenizer.chat_template
    assert tokenizer.eos_token_id == dense_tokenizer.eos_token_id
    for text in (PROMPT, "naïve café — 東京 🙂", "  leading spaces\tand tabs\n\n"):
        assert tokenizer.encode(text, add_special_tokens=False) == \
            dense_tokenizer.encode(text, add_special_tokens=False)
    messages = [{"role": "user", "content": "Say hi."}]
    assert (tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            == dense_tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                   tokenize=False))


def test_weights_selection_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown weights"):
        loading.load_target(None, weights="int4")
    with pytest.raises(ValueError, match="--weights quant-i8: quantized weights run in bf16"):
        loading.load_target(None, dtype="fp32", weights="quant-i8")
    with pytest.raises(ValueError, match="--weights quant-i8 needs a GGUF file"):
        loading.load_target(str(tmp_path), weights="quant-i8")
    with pytest.raises(ValueError, match="--weights quant: quantized weights run in bf16"):
        loading.load_target(None, dtype="fp32", weights="quant")
    with pytest.raises(ValueError, match="--weights quant: --backend hf"):
        loading.load_target(None, backend="hf", weights="quant")


def test_auto_takes_dense_where_quant_cannot_run(default_model):
    loaded = loading.load_target(default_model, dtype="fp32")
    assert loaded.weights == "dense" and loaded.target.dtype == torch.float32


@pytest.mark.skipif(not kernels.available(), reason="kernels off on this CPU")
def test_default_model_quant_logits_equal_dense_bf16(default_model):
    """300 positions: a prefill, one-token steps and an 8-token verification block."""
    quant = loading.load_target(default_model, weights="quant")
    assert quant.weights == "quant" and quant.target.weights_kind == "quant"
    dense = loading.load_target(default_model, dtype="bf16", weights="dense").target
    assert dense.weights_kind == "dense"
    ids = torch.tensor(quant.tokenizer.encode(PROMPT, add_special_tokens=False)[:300])
    assert ids.numel() == 300
    outs = []
    for model in (quant.target, dense):
        cache = model.new_cache(512)
        logits = [model.forward(ids[:200], cache).logits]
        logits += [model.forward(ids[i:i + 1], cache).logits for i in range(200, 260)]
        logits += [model.forward(ids[i:i + 8], cache).logits for i in range(260, 300, 8)]
        outs.append(torch.cat(logits))
    assert torch.equal(outs[0], outs[1])
    assert quant.target.weights_fingerprint() == dense.weights_fingerprint()


def _logits_in_blocks(model, ids: torch.Tensor) -> torch.Tensor:
    """A prefill, one-token steps and 8-token verification blocks, as decoding runs."""
    cache = model.new_cache(512)
    logits = [model.forward(ids[:200], cache).logits]
    logits += [model.forward(ids[i:i + 1], cache).logits for i in range(200, 260)]
    logits += [model.forward(ids[i:i + 8], cache).logits for i in range(260, 300, 8)]
    return torch.cat(logits)


@pytest.mark.skipif(not kernels.available() or not kernels.quant_i8_types(),
                    reason="no integer path on this CPU")
def test_default_model_int8_path_is_row_invariant_and_close_to_dense(default_model):
    """quant-i8's logits are its own, but a position's bits do not depend on how
    the positions around it were batched (what lossless speculation on it needs),
    and its greedy choice is the bf16 path's almost everywhere."""
    i8 = loading.load_target(default_model, weights="quant-i8")
    assert i8.weights == "quant-i8" and i8.target.weights_kind == "quant-i8"
    ids = torch.tensor(i8.tokenizer.encode(PROMPT, add_special_tokens=False)[:300])
    blocks = _logits_in_blocks(i8.target, ids)
    cache = i8.target.new_cache(512)
    singles = torch.cat([i8.target.forward(ids[i:i + 1], cache).logits for i in range(300)])
    assert torch.equal(blocks, singles)
    bf16 = _logits_in_blocks(loading.load_target(default_model, weights="quant").target, ids)
    assert not torch.equal(blocks, bf16)  # the activations' rounding is real
    agree = (blocks.argmax(-1) == bf16.argmax(-1)).float().mean().item()
    assert agree >= AGREEMENT, agree


@pytest.mark.skipif(not kernels.available(), reason="kernels off on this CPU")
def test_cli_reports_the_weights_used(default_model):
    """auto takes the integer path where the CPU has VNNI, else the bf16 one, and the
    stats line says which ran; quant's tokens are dense bf16's."""
    base = [sys.executable, "-m", "verispec.cli", "generate", "--model", default_model,
            "--prompt", "Say hi.", "--chat",
            "--max-new-tokens", "8", "--proposer", "none", "--k", "0"]
    auto = loading.auto_quant_kind()
    texts = {}
    kinds = ["auto", "quant", "dense"] + (["quant-i8"] if kernels.quant_i8_types() else [])
    for weights in kinds:
        run = subprocess.run(base + ["--json", "--weights", weights, "--dtype", "bf16"],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        result = json.loads(run.stdout)
        assert result["stats"]["weights"] == (auto if weights == "auto" else weights)
        texts[weights] = result["token_ids"]
    assert texts["quant"] == texts["dense"] and texts["auto"] == texts[auto]
    run = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and re.search(rf"weights={auto}(\s|$)", run.stdout)
    # A CPU without VNNI (forced) takes the bf16 path, and says so.
    forced = subprocess.run(base, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "VERISPEC_NO_VNNI": "1"})
    assert forced.returncode == 0 and re.search(r"weights=quant(\s|$)", forced.stdout)
