"""The EAGLE head's draft step on the native kernels (heads/native_layer.py) and
the draft vocabulary's LM-head rows in the target's own GGUF blocks: greedy
output is bit-identical to plain decoding on a bf16 native target, chains and
trees; tree rows equal their paths fed as chains bit for bit (the kernels are
row-invariant); the fused layer computes the eager layer's function; sampled
output follows the target's distribution."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import tiny_llama
from distribution_support import exact_marginals, first_two_counts, worst_pvalue
from heads_support import random_head, trained
from test_greedy_equality import PROMPTS, plain

from verispec import Engine, SamplingParams, SpecConfig, kernels
from verispec.models.llama import NativeLlama
from verispec.proposers import ProposerSetup, build
from verispec.proposers.base import DraftContext
from verispec.proposers.heads import load_head
from verispec.proposers.heads.eagle import HeadCache

pytestmark = pytest.mark.skipif(not kernels.available(), reason="needs verispec's bf16 kernels")


def _bf16_native(folder, seed=0, **kw) -> NativeLlama:
    tiny_llama(seed, **kw).save_pretrained(folder)
    return NativeLlama.from_dir(folder, dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """`tiny`'s weights (tiny_llama(0, layers=4)) on the native backend in bf16."""
    return _bf16_native(tmp_path_factory.mktemp("bf16-native"), layers=4)


@pytest.fixture(scope="module")
def heads(tmp_path_factory, tiny, target):
    """A briefly trained head (trained on `tiny`, the same weights in fp32; its
    config also accepts their bf16 fingerprint, as the shipped heads list one per
    dtype) and a random one."""
    root = tmp_path_factory.getbasetemp() / "heads"
    folder = tmp_path_factory.mktemp("bf16-heads") / "eagle-trained"
    shutil.copytree(trained(root, tiny, "eagle").folder, folder,
                    ignore=shutil.ignore_patterns("data", "checkpoint.pt"))
    config = json.loads((folder / "config.json").read_text())
    config["target_fingerprints"].append(target.weights_fingerprint())
    (folder / "config.json").write_text(json.dumps(config))
    return {"trained": str(folder),
            "random": str(random_head(folder.parent / "eagle-random", "eagle", target))}


def test_the_head_runs_its_layer_natively(target, heads):
    head = load_head(heads["trained"], "eagle", target)
    assert head.module._fused is not None
    head.module.pack(native=False)
    assert head.module._fused is None
    head.module.pack()
    assert head.module._fused is not None


@pytest.mark.parametrize("tree", [0, 6])
@pytest.mark.parametrize("name", ["trained", "random"])
def test_native_layer_computes_the_eager_layer(target, heads, name, tree):
    """The fused step and the eager one differ by bf16 rounding only (RoPE from
    bf16 tables, the kernel's attention): the same function of the same rows."""
    head = load_head(heads[name], "eagle", target)
    module = head.module
    tokens = torch.randint(0, target.vocab_size, (40,),
                           generator=torch.Generator().manual_seed(3)).tolist()
    hidden = target.forward(torch.tensor(tokens), target.new_cache(),
                            hidden_layers=head.hidden_layers).hidden[0]
    embeds = head.embed(torch.tensor(tokens[1:] + [0]))
    n = len(tokens)
    mask = None
    if tree:  # the last `tree` rows: each sees the real rows, row n - tree - 1 and itself
        mask = torch.zeros(tree, n, dtype=torch.bool)
        mask[:, : n - tree] = True
        mask[torch.arange(tree), torch.arange(n - tree, n)] = True
    outs, caches = [], []
    for native in (True, False):
        module.pack(native=native)
        cache = HeadCache(module.kv_heads, module.head_dim, torch.bfloat16, torch.device("cpu"))
        with torch.inference_mode():
            real = module.step(hidden[: n - tree], embeds[: n - tree], torch.arange(n - tree), cache)
            rows = real if not tree else module.step(
                hidden[n - tree:], embeds[n - tree:], torch.full((tree,), n - tree), cache, mask)
        outs.append(rows.float())
        caches.append(cache.kv[:, :, : cache.length].float())
    module.pack()
    # Relative to each row's (each key's) own size, a few bf16 roundings at most.
    def worst(a, b):
        return float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-6)).max())
    assert worst(outs[0], outs[1]) < 0.03
    assert worst(caches[0], caches[1]) < 0.03


@pytest.mark.parametrize("spec_options", [{"k": 1}, {"k": 4}, {"k": 3, "tree": 6},
                                          {"k": 4, "tree": 10, "tree_shape": "topb"},
                                          {"k": 3, "head_quant": "Q8_0"},
                                          {"k": 2, "tree": 4, "head_quant": "Q4_0"}],
                         ids=["k1", "k4", "tree6", "topb10", "q8", "q4-tree4"])
@pytest.mark.parametrize("name", ["trained", "random"])
def test_greedy_equality_on_the_native_layer(target, heads, name, spec_options):
    """Bit-exact: the native backend's greedy output is plain decoding's."""
    engine = Engine(target)
    spec = SpecConfig("eagle", head=heads[name], **spec_options)
    drafted = accepted = 0
    for prompt in PROMPTS:
        want = plain(engine, prompt)
        got = engine.generate(prompt, SamplingParams(max_new_tokens=32), spec)
        assert got.token_ids == want.token_ids
        drafted += got.stats.drafted
        accepted += got.stats.accepted
    assert drafted > 0
    if name == "trained":
        assert accepted > 0  # the accepted path is exercised, not only rejections


def test_head_quant_runs_the_heads_matrices_in_blocks(target, heads):
    from verispec.kernels import is_quantized

    for fmt in ("Q8_0", "Q4_0"):
        head = load_head(heads["trained"], "eagle", target, quant=fmt)
        packed = head.module._packed
        assert all(packed[n].format == fmt and is_quantized(packed[n].weight)
                   for n in ("fc", "qkv", "o", "gate_up", "down"))
        assert head.module._fused is not None
    assert load_head(heads["trained"], "eagle", target).module._packed["qkv"].format == "bf16"
    with pytest.raises(ValueError, match="head_quant"):
        SpecConfig("eagle", head_quant="Q2_K")


def test_tree_rows_equal_their_paths_fed_as_chains_bit_for_bit(target, heads, monkeypatch):
    """The kernels compute a row from its query and visible keys alone, so a tree
    row under its mask gives exactly the bits of its path drafted as a chain."""
    from verispec.proposers import eagle as eagle_module
    from verispec.proposers.tree_drafting import DraftTree
    from verispec.step.token_tree import ROOT

    spec = SpecConfig("eagle", head=heads["trained"], k=3, tree=12, tree_branch=2)
    proposer = build(ProposerSetup(target, spec, SamplingParams(), torch.Generator()))
    record = []
    real_grow = eagle_module.grow

    def path(draft: DraftTree, node: int) -> list[int]:
        out = []
        while node != ROOT:
            out.append(draft.tokens[node])
            node = draft.parents[node]
        return out[::-1]

    def spying_grow(expand, *args, **kwargs):
        def spy(draft, frontier):
            log_probs = expand(draft, frontier)
            record.append(([path(draft, node) for node in frontier], log_probs.clone()))
            return log_probs
        return real_grow(spy, *args, **kwargs)

    monkeypatch.setattr(eagle_module, "grow", spying_grow)
    tokens = torch.randint(0, target.vocab_size, (12,),
                           generator=torch.Generator().manual_seed(4)).tolist()
    hidden = target.forward(torch.tensor(tokens[:-1]), target.new_cache(),
                            hidden_layers=proposer.hidden_layers).hidden
    proposer.propose(DraftContext(tokens, len(tokens), hidden), 3)
    head, real_rows = proposer.head, proposer.real_rows
    assert len(record) == 3
    for paths, log_probs in record:
        for tokens_path, row in zip(paths, log_probs):
            cache = HeadCache(head.module.kv_heads, head.module.head_dim, torch.bfloat16,
                              torch.device("cpu"))
            cache.append(proposer.cache.keys[:real_rows].clone(),
                         proposer.cache.values[:real_rows].clone())
            feature = head.parts.final_norm(proposer.last_out)
            with torch.inference_mode():
                for depth, token in enumerate(tokens_path):
                    out = head.module.step(feature, head.embed(torch.tensor([token])),
                                           torch.tensor([len(tokens) - 1 + depth]), cache)
                    feature = head.parts.final_norm(out)
                want = torch.log_softmax(head.output.logits(feature).float(), -1)[0]
            assert torch.equal(row, want)


@pytest.mark.parametrize("tree", [0, 6])
def test_sampled_output_follows_the_target_on_the_native_layer(tmp_path, tree, full_size_runs):
    """2000 seeded three-token requests on a vocab-8 bf16 native target at T = 2,
    a random head drafting on the native layer (two tokens, or a 6-node tree):
    the first and second tokens pass chi-square against the target's exact
    marginals."""
    target = _bf16_native(tmp_path / "target", seed=11, layers=1, vocab=8)
    head = str(random_head(tmp_path / "head", "eagle", target, seed=1))
    assert load_head(head, "eagle", target).module._fused is not None
    prompt, temperature, runs = [1, 2, 3], 2.0, 2 * full_size_runs
    options = {"tree": tree, "tree_branch": 3} if tree else {}
    counts, drafted, accepted = first_two_counts(
        Engine(target), prompt, SpecConfig("eagle", k=2, head=head, **options), temperature, runs)
    assert drafted >= 2 * runs and 0.1 * runs < accepted < drafted
    marginals = exact_marginals(target, prompt, temperature)
    assert worst_pvalue(counts, marginals, runs) > 1e-3


def test_draft_rows_in_the_targets_blocks_give_the_dense_rows_logits(default_model):
    """The default model's LM head is its tied Q8_0 embedding: on the bf16 block
    path, the draft vocabulary's rows packed in those blocks give bit for bit
    the logits of the same rows dequantized to bf16, at about half the bytes."""
    from verispec.models.loading import load_target
    from verispec.proposers.heads.runtime import DraftOutput
    from verispec.proposers.heads.target_parts import target_parts

    target = load_target(default_model, weights="quant").target
    parts = target_parts(target)
    if parts.quant_rows is None:
        pytest.skip("the default model's LM head is not quantized here")
    ids = torch.arange(0, 8192)
    quant = DraftOutput(parts, ids, target.vocab_size)
    dense = DraftOutput(parts.__class__(**{**parts.__dict__, "quant_rows": None}), ids,
                        target.vocab_size)
    assert quant._linear.format == "Q8_0" and dense._linear.format == "bf16"
    x = torch.randn(5, target.hidden_size, generator=torch.Generator().manual_seed(0)).bfloat16()
    for rows in (1, 3, 5):
        assert torch.equal(quant.logits(x[:rows]), dense.logits(x[:rows]))


def test_draft_rows_on_the_integer_path_are_the_targets_logits(default_model):
    """On --weights quant-i8 the draft rows run the integer path too: each draft
    logit is bit for bit the target head's logit of that id, not the bf16 path's."""
    from verispec import kernels
    from verispec.models.loading import load_target
    from verispec.proposers.heads.runtime import DraftOutput
    from verispec.proposers.heads.target_parts import target_parts

    if not kernels.available() or not kernels.quant_i8_types():
        pytest.skip("no integer path on this CPU")
    target = load_target(default_model, weights="quant-i8").target
    parts = target_parts(target)
    ids = torch.cat([torch.arange(0, 4096), torch.tensor([4099, 20000, target.vocab_size - 1])])
    draft = DraftOutput(parts, ids, target.vocab_size)
    assert kernels.is_int8(draft._linear.weight)
    x = torch.randn(5, target.hidden_size, generator=torch.Generator().manual_seed(1)).bfloat16()
    full = parts.lm_head(x).float()
    for rows in (1, 3, 5):
        assert torch.equal(draft.logits(x[:rows]), full[:rows, ids])