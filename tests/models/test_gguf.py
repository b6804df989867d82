"""GGUF files read as they are: the loader against an independent dense
reference, quantized blocks in the kernels bit-identical to dense bf16, the
per-type fallback, and one clear error for every broken file."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from gguf_support import Q, Q4_K_M, TinyShape, write_tiny_gguf

from verispec import kernels
from verispec.models.gguf_file import GGUFError, GGUFFile
from verispec.models.llama import NativeLlama
from verispec.models.native_gguf import native_from_gguf

BLOCK_TYPES = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]
FLOAT_TYPES = [Q.F16, Q.BF16, Q.F32]
TOKENS = torch.tensor(np.random.default_rng(1).integers(0, 300, 72))


def kernel_types() -> set[int]:
    return set(kernels.quant_types()) if kernels.available() else set()


def needs_kernels(*types: Q):
    missing = [t.name for t in types if int(t) not in kernel_types()]
    return pytest.mark.skipif(not kernels.available() or bool(missing),
                              reason=f"kernels lack {missing or 'everything'} on this CPU")


def logits_every_way(model: NativeLlama) -> torch.Tensor:
    """[72, vocab] logits from a 40-position prefill, 8 one-token steps and a
    24-position block: plain decoding and verification in one comparison."""
    cache = model.new_cache(128)
    parts = [model.forward(TOKENS[:40], cache).logits]
    parts += [model.forward(TOKENS[i:i + 1], cache).logits for i in range(40, 48)]
    parts.append(model.forward(TOKENS[48:], cache).logits)
    return torch.cat(parts)


def pair(tmp_path, types, shape=TinyShape(), seed=0):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = write_tiny_gguf(tmp_path / "tiny.gguf", types, shape, seed, reference=tmp_path / "ref")
    return path, NativeLlama.from_dir(tmp_path / "ref", torch.bfloat16)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("tied", [False, True])
def test_dense_loader_equals_an_independent_reference(tmp_path, arch, tied):
    """The GGUF reader's mapping (names, metadata, llama's q/k row interleave) gives
    the transformers-order weights: same logits bit for bit, same fingerprint."""
    path, reference = pair(tmp_path, {"q": Q.Q4_K, "k": Q.Q5_0}, TinyShape(arch=arch, tied=tied))
    loaded = native_from_gguf(path, torch.bfloat16, quant=False)
    assert loaded.spec == reference.spec
    assert loaded.weights_kind == "dense"
    assert torch.equal(logits_every_way(loaded), logits_every_way(reference))
    assert loaded.weights_fingerprint() == reference.weights_fingerprint()


@pytest.mark.parametrize("qtype", BLOCK_TYPES + FLOAT_TYPES, ids=lambda t: t.name)
def test_quantized_blocks_equal_dense_bf16(tmp_path, qtype):
    if qtype in BLOCK_TYPES and int(qtype) not in kernel_types():
        pytest.skip(f"kernels lack {qtype.name}")
    if not kernels.available():
        pytest.skip("kernels off on this CPU")
    path, reference = pair(tmp_path, qtype)
    quant = native_from_gguf(path, torch.bfloat16, quant=True)
    assert quant.weights_kind == "quant"
    assert torch.equal(logits_every_way(quant), logits_every_way(reference))
    assert quant.weights_fingerprint() == reference.weights_fingerprint()


@needs_kernels(Q.Q4_K, Q.Q6_K, Q.Q8_0)
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_mixed_formats_of_a_q4_k_m_file(tmp_path, arch):
    """q/k in Q4_K with v in Q6_K share one pack of mixed blocks; where a part does
    not span whole 64-row tiles (one kv head of 32 rows) the parts run one by one.
    The dense logits bit for bit either way."""
    path, reference = pair(tmp_path, Q4_K_M, TinyShape(arch=arch, intermediate=768))
    quant = native_from_gguf(path, torch.bfloat16, quant=True)
    assert quant.layers[0].qkv.format == "Q4_K+Q6_K" and quant.layers[0].qkv.kernel
    assert torch.equal(logits_every_way(quant), logits_every_way(reference))
    odd = TinyShape(arch=arch, heads=8, kv_heads=1, hidden=256)  # k: 32 rows, not a 64-row tile
    path, reference = pair(tmp_path / "odd", Q4_K_M | {"q": Q.Q6_K, "k": Q.Q4_K}, odd)
    quant = native_from_gguf(path, torch.bfloat16, quant=True)
    assert quant.layers[0].qkv.format == "Q6_K+Q4_K" and not quant.layers[0].qkv.kernel
    assert torch.equal(logits_every_way(quant), logits_every_way(reference))


@pytest.mark.skipif(not kernels.available() or not {int(t) for t in Q4_K_M.values()} <= kernels.quant_i8_types(),
                    reason="no integer path on this CPU")
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_q4_k_m_file_runs_whole_on_the_integer_path(tmp_path, arch):
    """Every matrix of a Q4_K_M file takes int8 activations: the mixed Q4_K / Q6_K
    stacks, the head and the embedding (here also a 32-row k that splits q/k/v into
    parts). A position's logits are the same alone, in a prefill or in a block."""
    shapes = [TinyShape(arch=arch, intermediate=768), TinyShape(arch=arch, heads=8, kv_heads=1)]
    for i, shape in enumerate(shapes):
        path = write_tiny_gguf(tmp_path / f"tiny{i}.gguf", Q4_K_M, shape)
        model = native_from_gguf(path, torch.bfloat16, quant=True, int8=True)
        assert model.weights_kind == "quant-i8"
        layer = model.layers[0]
        linears = [layer.o, layer.gate_up, layer.down, model.weights.lm_head]
        linears += getattr(layer.qkv, "parts", [layer.qkv])
        assert all(kernels.is_int8(lin.weight) for lin in linears)
        assert kernels.is_int8(model.weights.embedding.packed)
        assert layer.qkv.format == "Q4_K+Q6_K"
        cache = model.new_cache(128)
        singles = torch.cat([model.forward(TOKENS[i:i + 1], cache).logits for i in range(len(TOKENS))])
        assert torch.equal(logits_every_way(model), singles)


@pytest.mark.skipif(not kernels.available(), reason="kernels off on this CPU")
def test_a_block_type_the_kernels_lack_runs_dense(tmp_path, capfd):
    lacking = [t for t in (Q.Q2_K, Q.Q3_K) if int(t) not in kernel_types()]
    if not lacking:
        pytest.skip("the kernels run every test type")
    path, reference = pair(tmp_path, {"gate": lacking[0], "q": Q.Q8_0})
    quant = native_from_gguf(path, torch.bfloat16, quant=True)
    notes = [line for line in capfd.readouterr().err.splitlines() if lacking[0].name in line]
    assert len(notes) == 1 and "dense bf16" in notes[0]
    assert quant.layers[0].gate_up.format == "bf16+Q8_0"
    assert quant.layers[0].qkv.format == "Q8_0"
    assert torch.equal(logits_every_way(quant), logits_every_way(reference))


# -- broken files ------------------------------------------------------------

def test_llama31_rope_freqs(tmp_path):
    """Llama 3.1 files carry their RoPE scaling as a rope_freqs tensor of per-frequency
    divisors. Read as llama.cpp reads it, it is transformers' "llama3" scaling: the
    frequencies agree to float32 rounding, the fp32 logits closely, and the factors
    change the output (a file without them differs). The quantized path keeps its
    bit identity with the dense bf16 one."""
    from verispec.models.llama_config import inverse_frequencies

    shape = TinyShape(llama3_rope=True)
    path, _ = pair(tmp_path, Q.Q8_0, shape)
    reference = NativeLlama.from_dir(tmp_path / "ref", torch.float32)
    loaded = native_from_gguf(path, torch.float32, quant=False)
    assert loaded.spec.rope.kind == "freq_factors" and reference.spec.rope.kind == "llama3"
    ours, theirs = (inverse_frequencies(m.spec.rope, shape.head_dim) for m in (loaded, reference))
    assert torch.allclose(ours, theirs, rtol=3e-7, atol=0)
    want = logits_every_way(reference)
    assert (logits_every_way(loaded) - want).abs().max() < 1e-3 * want.abs().max()
    plain = native_from_gguf(write_tiny_gguf(tmp_path / "plain.gguf", Q.Q8_0, TinyShape()),
                                  torch.float32, quant=False)
    assert not torch.equal(inverse_frequencies(plain.spec.rope, shape.head_dim), theirs)
    assert (logits_every_way(plain) - want).abs().max() > 1e-2 * want.abs().max()
    if kernels.available():
        quant = native_from_gguf(path, torch.bfloat16, quant=True)
        dense = native_from_gguf(path, torch.bfloat16, quant=False)
        assert torch.equal(logits_every_way(quant), logits_every_way(dense))
    # The transformers conversion (--weights dense) would drop the factors: refused.
    from verispec.models.loading import convert_gguf

    with pytest.raises(ValueError, match="rope_freqs"):
        convert_gguf(path, quiet=True)


def test_llama31_dense_weights_keep_rope_freqs(tmp_path):
    """--weights dense on a Llama 3.1 file reads it with the native GGUF reader, not
    transformers' conversion (which drops rope_freqs): the factors stay, fp32 logits
    follow the llama3-scaled reference, bf16 ones equal the quantized path's bit for
    bit. transformers' backend cannot keep them and says so."""
    from verispec.models.loading import load_target

    path, _ = pair(tmp_path, Q.Q8_0, TinyShape(llama3_rope=True))
    want = logits_every_way(NativeLlama.from_dir(tmp_path / "ref", torch.float32))
    dense = load_target(str(path), dtype="fp32", weights="dense")
    assert (dense.backend, dense.weights) == ("native", "dense")
    assert dense.target.weights_kind == "dense" and dense.target.spec.rope.kind == "freq_factors"
    assert (logits_every_way(dense.target) - want).abs().max() < 1e-3 * want.abs().max()
    if kernels.available():
        bf16 = load_target(str(path), dtype="bf16", weights="dense")
        quant = load_target(str(path), weights="quant")
        assert (bf16.weights, quant.weights) == ("dense", "quant")
        assert torch.equal(logits_every_way(bf16.target), logits_every_way(quant.target))
    with pytest.raises(ValueError, match="rope_freqs"):
        load_target(str(path), backend="hf", weights="dense")


def test_truncated_file(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = path.read_bytes()
    for cut in (10, 400, len(data) // 2, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(GGUFError, match="truncated|not a GGUF"):
            GGUFFile(path)


def test_wrong_magic_and_not_a_gguf(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = bytearray(path.read_bytes())
    data[:4] = b"GGUX"
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="is not a GGUF file"):
        GGUFFile(path)
    text = tmp_path / "notes.gguf"
    text.write_text("just some text, long enough to have a header's worth of bytes\n")
    with pytest.raises(GGUFError, match="is not a GGUF file"):
        GGUFFile(text)


def test_corrupt_metadata(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = bytearray(path.read_bytes())
    data[16:24] = (2**40).to_bytes(8, "little")  # the metadata count
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="corrupt"):
        GGUFFile(path)


def test_shape_that_disagrees_with_the_config(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf", corrupt_shape="o")
    with pytest.raises(GGUFError, match=r"blk\.0\.attn_output\.weight has shape \(257, 256\)"):
        native_from_gguf(path, torch.bfloat16, quant=False)


def test_mutated_headers_never_crash(tmp_path):
    """Random byte flips and cuts in the header: a GGUFFile or a GGUFError, nothing else."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = path.read_bytes()
    header = GGUFFile(path).tensors["token_embd.weight"].offset
    rng = np.random.default_rng(0)
    outcomes = {"ok": 0, "error": 0}
    for _ in range(300):
        mutated = bytearray(data[: rng.integers(24, len(data) + 1)] if rng.random() < 0.2 else data)
        for pos in rng.integers(0, header, rng.integers(1, 4)):
            if pos < len(mutated):
                mutated[pos] = int(rng.integers(0, 256))
        path.write_bytes(bytes(mutated))
        try:
            GGUFFile(path)
            outcomes["ok"] += 1
        except GGUFError as exc:
            assert "\n" not in str(exc)
            outcomes["error"] += 1
    assert outcomes["error"] > 50


@pytest.mark.parametrize("damage", ["truncate", "magic"])
def test_cli_prints_one_line_for_a_broken_file(tmp_path, damage):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3] if damage == "truncate" else b"\0" * 4 + data[4:])
    for weights in ("auto", "dense"):
        run = subprocess.run([sys.executable, "-m", "verispec.cli", "generate", "--prompt", "hi",
                              "--model", str(path), "--weights", weights],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 2, run.stderr
        errors = [line for line in run.stderr.splitlines() if "error:" in line]
        assert "Traceback" not in run.stderr and len(errors) == 1
        assert "tiny.gguf" in errors[0]


def test_a_vocabulary_the_tokenizer_cannot_be_built_from(tmp_path):
    """A llama-model vocabulary without its scores (or a gpt2 one without merges):
    transformers' conversion fails deep inside, verispec says so in one line."""
    def vocab_without_scores(writer):
        writer.add_tokenizer_model("llama")
        writer.add_token_list([f"t{i}" for i in range(TinyShape().vocab)])

    path = write_tiny_gguf(tmp_path / "noscores.gguf", tokenizer=vocab_without_scores)
    run = subprocess.run([sys.executable, "-m", "verispec.cli", "generate", "--prompt", "hi",
                          "--model", str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run.stderr
    errors = [line for line in run.stderr.splitlines() if "error:" in line]
    assert "Traceback" not in run.stderr and len(errors) == 1, run.stderr
    assert "noscores.gguf" in errors[0] and "tokenizer" in errors[0]
