"""The embedded default model (a Q4_1 GGUF with a Q8_0 embedding) read as it is:
quantized logits bit-identical to today's dense bf16 path, its own tokenizer
and chat template, and the --weights selection."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from verispec import kernels
from verispec.models import loading

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


def test_weights_selection_errors():
    with pytest.raises(ValueError, match="unknown weights"):
        loading.load_target(None, weights="int4")
    with pytest.raises(ValueError, match="--weights quant: quantized weights run in bf16"):
        loading.load_target(None, dtype="fp32", weights="quant")
    with pytest.raises(ValueError, match="--weights quant: --backend hf"):
        loading.load_target(None, backend="hf", weights="quant")


def test_auto_takes_dense_where_quant_cannot_run():
    loaded = loading.load_target(None, dtype="fp32")
    assert loaded.weights == "dense" and loaded.target.dtype == torch.float32


@pytest.mark.skipif(not kernels.available(), reason="kernels off on this CPU")
def test_default_model_quant_logits_equal_dense_bf16():
    """300 positions: a prefill, one-token steps and an 8-token verification block."""
    quant = loading.load_target(None, weights="quant")
    assert quant.weights == "quant" and quant.target.weights_kind == "quant"
    dense = loading.load_target(None, dtype="bf16", weights="dense").target
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


@pytest.mark.skipif(not kernels.available(), reason="kernels off on this CPU")
def test_cli_reports_the_weights_used():
    base = [sys.executable, "-m", "verispec.cli", "generate", "--prompt", "Say hi.", "--chat",
            "--max-new-tokens", "8", "--proposer", "none", "--k", "0"]
    texts = {}
    for weights in ("auto", "dense"):
        run = subprocess.run(base + ["--json", "--weights", weights, "--dtype", "bf16"],
                             capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        result = json.loads(run.stdout)
        assert result["stats"]["weights"] == ("quant" if weights == "auto" else "dense")
        texts[weights] = result["token_ids"]
    assert texts["auto"] == texts["dense"]
    run = subprocess.run(base, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and "weights=quant" in run.stdout
