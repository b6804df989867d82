"""Device handling under a pretend GPU (tests/fake_cuda.py): no host-only call on a
device tensor, and the host syncs a step costs, counted. A CUDA-only crash (a
`.numpy()` on a device tensor, a host tensor mixed into a device op) fails here."""
from __future__ import annotations

import hashlib

import pytest
import torch

from conftest import CharTokenizer, tiny_llama
from heads_support import random_head
from fake_cuda import FakeCuda, ReplayedSteps, on_fake
from verispec import Engine, SamplingParams, SpecConfig
from verispec.models import cuda_setup, static_llama
from verispec.models.hf import HFModel
from verispec.models.llama import NativeLlama
from verispec.models.llama_weights import _digest_part
from verispec.models.loading import load_target
from verispec.models.static_llama import StaticLlama
from verispec.rejection import verify_sampling
from verispec.sampling import ProbRows, greedy_tokens


@pytest.fixture(scope="module")
def repetitive(tmp_path_factory):
    """A 1-layer model over 12 tokens whose greedy output cycles: n-gram drafts hit."""
    folder = tmp_path_factory.mktemp("repetitive")
    tiny_llama(1, layers=1, vocab=12).save_pretrained(folder)
    return folder


def test_the_fake_gpu_fails_as_a_gpu_does():
    with FakeCuda() as fake:
        x = torch.ones(4, device="cuda")
        assert on_fake(x) and x.device.type == "cuda"
        with pytest.raises(TypeError, match="cuda:0 device type tensor to numpy"):
            x.numpy()
        with pytest.raises(RuntimeError, match="same device"):
            torch.cat([x, torch.ones(4)])
        assert x.sum().tolist() == 4.0 and fake.syncs == 1
        assert not on_fake(x.cpu()) and fake.syncs == 2


def test_fingerprints_read_device_weights():
    """`_digest_part` (both backends' fingerprint sample) on a device tensor: the
    same bytes as on CPU, where `.numpy()` on the device tensor crashed on CUDA."""
    weight = torch.randn(300, 7).to(torch.bfloat16)
    want = weight.detach().float().flatten()[:: 300 * 7 // 64][:64].numpy().tobytes()
    with FakeCuda():
        assert _digest_part(weight.to("cuda")) == want
    model = tiny_llama(0, layers=1)
    digest = hashlib.sha256()
    for key, tensor in sorted(model.state_dict().items()):
        digest.update(key.encode())
        flat = tensor.detach().float().flatten()
        digest.update(flat[:: max(1, flat.numel() // 64)][:64].numpy().tobytes())
    assert HFModel(model).weights_fingerprint() == digest.hexdigest()[:16]


def test_greedy_argmax_on_the_device_is_one_read():
    logits = torch.randn(5, 50)
    logits[2, 7] = logits[2, 9] = logits[2].max() + 1  # a tie: the first index wins
    want = greedy_tokens(logits)
    with FakeCuda() as fake:
        assert greedy_tokens(logits.to("cuda", non_blocking=True)) == want
        assert fake.syncs == 1
    assert want[2] == 7


def _static_on_fake(folder) -> StaticLlama:
    return StaticLlama.from_native(NativeLlama.from_dir(folder, dtype=torch.float32,
                                                        device="cuda"), width=8, graphs=False)


@pytest.mark.parametrize("tree", [0, 8])
def test_a_greedy_step_costs_one_host_sync(repetitive, tree):
    """Greedy n-gram speculation on the static path: one host read per step (the
    device verdict, or a tree's argmax rows), none per token, none for the drafts,
    none for the prefill; and the output is the CPU's."""
    cpu = Engine(StaticLlama.from_native(NativeLlama.from_dir(repetitive, torch.float32), width=8))
    spec = SpecConfig("ngram", k=6, tree=tree)
    want = cpu.generate([1, 2, 3], SamplingParams(max_new_tokens=40), spec)
    with FakeCuda() as fake:
        engine = Engine(_static_on_fake(repetitive), tokenizer=CharTokenizer())
        fake.reset()
        got = engine.generate([1, 2, 3], SamplingParams(max_new_tokens=40), spec)
    assert got.token_ids == want.token_ids
    assert got.stats.accepted > 0
    assert fake.syncs == got.stats.target_forwards, fake.sites


def test_sampled_verification_reads_the_device_once_per_step():
    """Rejection sampling on device logits: the drafts' probabilities come back in one
    read, not one per draft (and the residual draw in another)."""
    logits = torch.randn(7, 40)
    drafts = logits[:6].argmax(-1)  # likely accepted: the walk reads every row
    params = SamplingParams(temperature=1.0, seed=0)
    with FakeCuda() as fake:
        generator = torch.Generator().manual_seed(0)
        verdict = verify_sampling(drafts, None, ProbRows(logits.to("cuda", non_blocking=True),
                                                         params), generator)
        assert fake.syncs <= 3, fake.sites
    assert 0 <= verdict.num_accepted <= 6 and len(verdict.tokens) == verdict.num_accepted + 1


def test_loading_on_cuda_takes_the_static_path(repetitive, monkeypatch):
    """load_target on a (pretend) GPU: the cuBLAS settings first, the Llama family on
    the static path with its self-check run, a step per cache buffer captured
    (here: run eagerly); the output is the CPU's."""
    calls = []
    monkeypatch.setattr(cuda_setup, "batch_invariant_blas", lambda: calls.append("blas") or {})

    monkeypatch.setattr(static_llama, "StepGraphs", ReplayedSteps)
    spec = SpecConfig("ngram", k=4)
    want = Engine(StaticLlama.from_native(NativeLlama.from_dir(repetitive, torch.float32))
                  ).generate([1, 2, 3], SamplingParams(max_new_tokens=24), spec)
    with FakeCuda():
        loaded = load_target(str(repetitive), device="cuda", dtype="fp32")
        model = loaded.target
        got = Engine(model).generate([1, 2, 3], SamplingParams(max_new_tokens=24), spec)
    assert calls == ["blas"]
    assert isinstance(model, StaticLlama) and loaded.backend == "native"
    assert model.row_check.ok, model.row_check.detail
    assert model.graphs.keys and all(hidden == () for _, hidden in model.graphs.keys)
    assert got.token_ids == want.token_ids


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_heads_draft_on_the_device_with_a_read_per_proposal(repetitive, tmp_path, kind):
    """EAGLE and Medusa on a (pretend) GPU: they read the target's hidden rows there,
    their chain comes to the host once per proposal, and the output is plain greedy's."""
    cpu = StaticLlama.from_native(NativeLlama.from_dir(repetitive, torch.float32), width=8)
    head = str(random_head(tmp_path / kind, kind, cpu))
    want = Engine(cpu).generate([1, 2, 3], SamplingParams(max_new_tokens=24),
                                SpecConfig("none", k=0))
    spec = SpecConfig(kind, k=3, head=head)
    with FakeCuda() as fake:
        engine = Engine(_static_on_fake(repetitive))
        engine.generate([1, 2, 3], SamplingParams(max_new_tokens=2), spec)  # loads the head
        fake.reset()
        got = engine.generate([1, 2, 3], SamplingParams(max_new_tokens=24), spec)
        generating = fake.syncs
        fake.reset()
        logprobs = engine.prompt_logprobs([1, 2, 3, 4], top=2)
    assert got.token_ids == want.token_ids and got.stats.drafted > 0
    drafting = sum(1 for step in got.stats.steps if step.k)
    assert generating <= got.stats.target_forwards + drafting + 2, fake.sites
    assert fake.syncs <= 4, fake.sites  # the prompt in, the picked values and the top lists out
    assert logprobs[0] is None and len(logprobs[1].top) == 2
