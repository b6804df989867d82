"""GGUF files outside the Llama family (llama.cpp's qwen2, phi3, gemma2 and
gemma3 layouts, written here with the gguf package's writer): they load
natively in their quantized blocks, give the bits of the same weights loaded
dense, agree with transformers on those weights, speculate losslessly past their
sliding windows, and tokenize with the file's own tokenizer and BOS rule."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf_support import Q, TinyShape, write_tiny_gguf
from test_gguf import TOKENS, logits_every_way
from tokenizer_support import TEXTS, family_tokenizer, gguf_bpe_writer
from transformers import AutoModelForCausalLM, AutoTokenizer

from verispec import Engine, SamplingParams, SpecConfig, kernels
from verispec.models.gemma import NativeGemma, native_class
from verispec.models.llama_weights import read_config
from verispec.models.native_gguf import native_from_gguf

pytestmark = pytest.mark.skipif(not kernels.available(), reason="verispec kernels unavailable")
WINDOW = 16  # TOKENS is 72 long: four and a half windows
# Gemma at its real head size (256, on the kernels too), Gemma 3 with its 5:1
# local/global pattern (layer 5 global), Phi-3 with q/k/v and gate/up fused.
SHAPES = {
    "qwen2": TinyShape(arch="qwen2"),
    "phi3": TinyShape(arch="phi3", window=WINDOW),
    "gemma2": TinyShape(arch="gemma2", hidden=512, heads=2, kv_heads=1, window=WINDOW),
    "gemma3": TinyShape(arch="gemma3", hidden=512, heads=2, kv_heads=1, layers=6, window=WINDOW),
}
SLIDING = {"qwen2": (), "phi3": (True, True), "gemma2": (True, False),
           "gemma3": (True,) * 5 + (False,)}
MIX = {"embed": Q.Q8_0, "q": Q.Q4_K, "k": Q.Q4_K, "v": Q.Q6_K, "o": Q.Q5_0, "gate": Q.Q4_K,
       "up": Q.Q4_K, "down": Q.Q6_K, "head": Q.Q6_K}


def _files(tmp_path, arch: str, tokenizer=None):
    path = write_tiny_gguf(tmp_path / f"{arch}.gguf", MIX, SHAPES[arch], seed=2,
                           reference=tmp_path / "ref", tokenizer=tokenizer,
                           eos=None if tokenizer else 1)
    return path, tmp_path / "ref"


@pytest.mark.parametrize("arch", list(SHAPES))
def test_quantized_file_equals_its_weights_dense_and_transformers(tmp_path, arch):
    path, ref = _files(tmp_path, arch)
    quant = native_from_gguf(path, torch.bfloat16, quant=True)
    assert isinstance(quant, NativeGemma) == arch.startswith("gemma")
    assert quant.weights_kind == "quant" and quant.spec.sliding_layers == SLIDING[arch]
    assert quant.row_kernels and quant.fuses_batches
    dense = native_class(read_config(ref)).from_dir(ref, torch.bfloat16)
    assert quant.spec == dense.spec
    # Quantized blocks in the kernels == the dequantized weights in bf16, bit for bit,
    # in plain decoding and in blocks, past the window.
    assert torch.equal(logits_every_way(quant), logits_every_way(dense))
    # The reference folder is what transformers means by these weights.
    hf = AutoModelForCausalLM.from_pretrained(str(ref), dtype=torch.float32).eval()
    native32 = native_class(read_config(ref)).from_dir(ref, torch.float32)
    with torch.no_grad():
        want = hf(TOKENS[None]).logits[0]
    got = native32.forward(TOKENS, native32.new_cache(128)).logits
    assert (got - want).abs().max() < 2e-4
    # Greedy speculation on the quantized file equals its plain greedy decoding.
    engine = Engine(quant)
    prompt = TOKENS[:40].tolist()
    fixed = SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = engine.generate(prompt, fixed, SpecConfig("none")).token_ids
    for spec in (SpecConfig("ngram", k=4), SpecConfig("draft", draft="self:1", k=3),
                 SpecConfig("draft", draft="quant:Q4_0", k=3),  # re-read from the file
                 SpecConfig("draft", draft="self:1", k=3, tree=8, tree_shape="topb", tree_branch=2)):
        assert engine.generate(prompt, fixed, spec).token_ids == plain, spec
    assert plain == Engine(dense).generate(prompt, fixed, SpecConfig("none")).token_ids


@pytest.mark.parametrize("arch", list(SHAPES))
def test_file_tokenizer_and_bos_on_raw_text(tmp_path, arch):
    """`--model FILE.gguf` on raw text: the file's tokenizer, BOS as its metadata says,
    the native quantized backend, and the same greedy tokens as the dense weights."""
    tokenizer = family_tokenizer("llama3")
    write, vocab = gguf_bpe_writer(tokenizer, add_bos=True)
    shape = SHAPES[arch]
    SHAPES[arch] = TinyShape(**{**shape.__dict__, "vocab": vocab})
    try:
        path, ref = _files(tmp_path, arch, tokenizer=write)
    finally:
        SHAPES[arch] = shape
    engine = Engine(str(path), dtype="bf16", weights="quant")  # the dense logits, below
    assert (engine.backend, engine.weights) == ("native", "quant")
    reference = AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in TEXTS:
        ids = engine.encode(text)
        assert ids == reference(text)["input_ids"] and ids[0] == reference.bos_token_id
    dense = Engine(native_class(read_config(ref)).from_dir(ref, torch.bfloat16))
    fixed = SamplingParams(max_new_tokens=12, ignore_eos=True)
    text = " ".join(TEXTS)
    want = dense.generate(engine.encode(text), fixed).token_ids
    assert engine.generate(text, fixed, SpecConfig("ngram", k=3)).token_ids == want
    # --weights dense: transformers' conversion of the file (with the fields it
    # leaves at defaults read as llama.cpp reads them) gives the reference's bits.
    converted = Engine(str(path), dtype="fp32")
    assert (converted.backend, converted.weights) == ("native", "dense")
    assert converted.encode(text) == engine.encode(text)
    reference32 = native_class(read_config(ref)).from_dir(ref, torch.float32)
    tokens = torch.tensor(engine.encode(text) * 3)
    assert torch.equal(converted.target.forward(tokens, converted.target.new_cache()).logits,
                       reference32.forward(tokens, reference32.new_cache()).logits)


def test_auto_backend_says_why_a_file_is_not_native(tmp_path, capsys):
    """A Phi-3 file with LongRoPE factors: transformers' conversion drops them, so the
    file's metadata decides; --backend auto runs HF and names the reason."""
    write, vocab = gguf_bpe_writer(family_tokenizer("llama3"), add_bos=True)
    shape = TinyShape(arch="phi3", vocab=vocab, window=WINDOW)

    def longrope(writer):
        write(writer)
        for name in ("rope_factors_long.weight", "rope_factors_short.weight"):
            writer.add_tensor(name, np.ones(shape.head_dim // 2, dtype=np.float32))

    path = write_tiny_gguf(tmp_path / "phi3-long.gguf", MIX, shape, seed=2, tokenizer=longrope,
                           eos=None)
    engine = Engine(str(path), dtype="bf16")
    assert engine.backend == "hf"
    out = engine.generate("Hello world", SamplingParams(max_new_tokens=4, ignore_eos=True))
    assert "not native: the native backend does not implement Phi-3's LongRoPE" in out.stats.backend
    with pytest.raises(ValueError, match="LongRoPE"):
        Engine(str(path), backend="native")
