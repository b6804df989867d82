"""The CUDA path's code on CPU: StaticLlama's fixed-width steps (graphs aside), its
pooled caches, the device greedy verdict, the start-up self-check, and how loading
routes a model on CUDA. Greedy equality for every proposer runs on it in
test_greedy_equality.py (the "static" target); host syncs in test_device_syncs.py."""
from __future__ import annotations

import gc

import pytest
import torch

from conftest import CharTokenizer
from fake_cuda import ReplayedSteps
from verispec import Engine, SamplingParams, SpecConfig
from verispec.models.cuda_setup import static_unsupported
from verispec.models.gemma import NativeGemma
from verispec.models.llama import NativeLlama
from verispec.models.row_check import check_rows
from verispec.models.static_llama import StaticLlama


@pytest.fixture(scope="module")
def static(tiny_native):
    return StaticLlama.from_native(tiny_native, width=8)


def test_static_step_computes_the_native_forward(static, tiny_native):
    """The padded step is the same function as the native forward: fp32 logits agree
    to rounding over a prefill that spans several steps, a chain and a tree."""
    ids = torch.arange(5, 45) % static.vocab_size
    for model in (static, tiny_native):
        model.cache = model.new_cache(64)
    want = tiny_native.forward(ids, tiny_native.cache).logits
    got = static.forward(ids, static.cache).logits
    assert got.shape == want.shape == (40, static.vocab_size)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    mask = torch.ones(3, 43, dtype=torch.bool)
    mask[1, 42] = mask[2, 41] = False  # two siblings below the first row
    positions = torch.tensor([40, 41, 41])
    tree = torch.tensor([7, 8, 9])
    want = tiny_native.forward(tree, tiny_native.cache, positions=positions, mask=mask).logits
    got = static.forward(tree, static.cache, positions=positions, mask=mask).logits
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)


def test_outputs_survive_the_next_replay(tiny_native):
    """A block of several steps returns every step's rows, though each replay of a
    captured step overwrites the outputs of the one before."""
    eager = StaticLlama.from_native(tiny_native, width=8)
    replayed = StaticLlama.from_native(tiny_native, width=8)
    replayed.graphs = ReplayedSteps(replayed._step)
    ids = torch.arange(5, 30)
    want = eager.forward(ids, eager.new_cache(), hidden_layers=(1, 4))
    got = replayed.forward(ids, replayed.new_cache(), hidden_layers=(1, 4))
    assert torch.equal(got.logits, want.logits)
    assert all(torch.equal(a, b) for a, b in zip(got.hidden, want.hidden))
    assert replayed.graphs.keys == {(0, (1, 4))}


def test_decode_equals_verify_bit_for_bit(static):
    """The property speculation rests on, on this CPU: the self-check at every block
    width, one step and across steps (a 13-row block is two 8-row steps)."""
    for block in (2, 5, 8, 9, 13):
        result = check_rows(static, block)
        assert result.ok, result.detail


def test_device_verdict_is_the_longest_matching_prefix(static):
    """ForwardOutput.greedy: accepted drafts, then each row's argmax (first on ties)."""
    cache = static.new_cache()
    static.forward(torch.arange(3, 20), cache)
    base = cache.length
    greedy = [20]  # plain greedy decoding from here: the drafts a perfect proposer makes
    for _ in range(4):
        greedy.append(int(static.forward(torch.tensor(greedy[-1:]), cache).logits[0].argmax()))
    for right in range(4):
        cache.truncate(base)
        drafts = greedy[1:right + 1] + [(greedy[right + 1] + 1) % static.vocab_size] * (3 - right)
        out = static.forward(torch.tensor([20, *drafts]), cache)
        verdict = out.greedy.tolist()
        assert verdict[0] == right
        assert verdict[1:] == out.logits.argmax(-1).tolist()
    cache.truncate(base)
    assert static.forward(torch.arange(3, 20), cache, num_logits=1).greedy is None


def test_caches_come_from_a_reused_pool(tiny_native):
    """A request's cache is a pooled buffer: a dropped cache's buffer serves the next
    request (on CUDA its captured graph with it), and a live one is never shared."""
    model = StaticLlama.from_native(tiny_native, width=8)
    first = model.new_cache()
    second = model.new_cache()
    assert first.slab != second.slab and len(model.pool.buffers) == 2
    slab = first.slab
    del first
    gc.collect()
    assert model.new_cache().slab == slab and len(model.pool.buffers) == 2
    with pytest.raises(ValueError, match="static cache"):
        model.new_cache(model.max_context + 1)
    with pytest.raises(ValueError, match="its own new_cache"):
        model.forward(torch.tensor([1]), tiny_native.new_cache(16))


class RowCountLeak(StaticLlama):
    """A model whose logits depend on how many rows its block holds, as a GPU whose
    matmuls pick another algorithm per row count would: the self-check must see it."""

    def _step(self, kv, hidden_layers):
        out = super()._step(kv, hidden_layers)
        out.logits.add_(1e-3 * self._ints[3 * self.width].float())
        return out


def test_self_check_refuses_speculation_on_a_broken_gpu(tiny_native):
    model = RowCountLeak.from_native(tiny_native, width=8)
    model.row_check = check_rows(model)
    assert not model.row_check.ok
    assert "8-row verify block differs from the same position decoded alone" in model.row_check.detail
    engine = Engine(model, tokenizer=CharTokenizer())
    with pytest.raises(ValueError, match="speculation refused: this GPU breaks"):
        engine.generate([3, 4, 5], SamplingParams(max_new_tokens=4), SpecConfig("ngram", k=4))
    plain = engine.generate([3, 4, 5], SamplingParams(max_new_tokens=4), SpecConfig("none", k=0))
    assert len(plain.token_ids) == 4


def test_buffers_made_inside_inference_mode_take_tree_steps(tiny_native):
    """The self-check runs under inference mode and leaves its cache's buffer to the
    first request, whose tree steps compact it in place outside inference mode."""
    model = StaticLlama.from_native(tiny_native, width=8)
    model.row_check = check_rows(model)
    engine = Engine(model, tokenizer=CharTokenizer())
    prompt = [7, 7, 7, 7, 8, 7, 7, 7]
    want = engine.generate(prompt, SamplingParams(max_new_tokens=16), SpecConfig("none", k=0))
    got = engine.generate(prompt, SamplingParams(max_new_tokens=16), SpecConfig("ngram", tree=8))
    assert got.token_ids == want.token_ids and len(model.pool.buffers) == 1


def test_self_draft_of_a_static_model_is_static(static):
    draft = static.truncated(2)
    assert isinstance(draft, StaticLlama) and draft.num_layers == 2
    assert draft.width == static.width and draft.pool is not static.pool


def test_only_the_llama_family_takes_the_cuda_path():
    assert static_unsupported(NativeLlama) == ""
    assert "Llama family" in static_unsupported(NativeGemma)
