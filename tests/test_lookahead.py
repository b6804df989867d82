"""Lookahead decoding: the pool keeps what the paper keeps, the window's n-grams
are the target's own tokens at the rows the engine hands back, every step fits
its budget, and the proposer is lossless (greedy identical on chains and trees,
both backends, the default model; sampled output the target's)."""
from __future__ import annotations


import pytest
import torch

from conftest import CharTokenizer, tiny_target
from test_head_equality import _exact_marginals, _first_two_counts, _worst_pvalue
from tree_support import tree_request
from verispec import Engine, SamplingParams, SpecConfig
from verispec.cli_args import spec_from
from verispec.lossless import compare_greedy
from verispec.proposers.base import DraftContext, VerifiedRows
from verispec.proposers.lookahead import (JacobiWindow, LookaheadProposer, LookaheadSettings,
                                          NgramPool)
from verispec.spec_text import parse_spec, parse_token

PLAIN = SpecConfig("none", k=0)
PROMPTS = [[3, 17, 4, 9, 3, 17, 4], list(range(10, 40)), [7, 7, 7, 7, 8, 7, 7, 7]]


def test_pool_keys_on_the_first_token_drops_duplicates_keeps_the_newest():
    pool = NgramPool(3, per_key=2)
    pool.add_text([1, 2, 3, 1, 2, 3, 1, 5, 6])
    # (1, 2, 3) twice is kept once; (1, 5, 6) is newer.
    assert pool.continuations(1, 5) == [(5, 6), (2, 3)]
    pool.add((1, 7, 7))  # a third distinct one evicts the oldest
    assert pool.continuations(1, 5) == [(7, 7), (5, 6)]
    pool.add((1, 5, 6))  # a duplicate becomes the newest
    assert pool.continuations(1, 1) == [(5, 6)]
    pool.add((1, 2))  # not an n-gram of this pool's length
    assert len(pool) == 2 + len(pool.continuations(2, 9)) + len(pool.continuations(3, 9))


def test_window_moves_up_a_level_and_reads_columns_as_ngrams():
    window = JacobiWindow([[10, 11, 12]], depth=2)
    # Warm-up: the first level's rows become level 1; no n-grams yet.
    assert window.advance({(0, 0): 20, (0, 1): 21, (0, 2): 22}) == []
    assert window.levels == [[10, 11, 12], [20, 21, 22]]
    assert window.column_path(1) == [(0, 0), (0, 1), (1, 1)]
    # Warm: each fed column read down, then the target's token after it; column 2's
    # top was cut by the budget, so it keeps its guess and gives no n-gram.
    grams = window.advance({(0, 0): 0, (0, 1): 0, (1, 0): 30, (1, 1): 31})
    assert grams == [(10, 20, 30), (11, 21, 31)]
    assert window.levels == [[20, 21, 22], [30, 31, 22]]


class Checked(LookaheadProposer):
    """Checks at every step that the rows the engine hands back are the target's
    argmax after each fed node's own path, and that the step fit its budget."""

    def __init__(self, target, **kw) -> None:
        super().__init__(target.eos_token_ids, **kw)
        self.target, self.checked, self.context = target, 0, []

    def propose(self, ctx: DraftContext, k: int):
        self.context, self.k, self.budget = list(ctx.tokens), k, ctx.tree_budget(self.tree_nodes)
        proposal = super().propose(ctx, k)
        tree = proposal.tree
        if tree is not None:
            assert tree.max_depth <= k and len(tree) <= self.budget
        return proposal

    def verified(self, rows: VerifiedRows) -> None:
        fed = self._fed
        cells = fed.cells.items() if fed is not None else ()  # None: the step drafted nothing
        for cell, node in cells:
            path, at = [], node
            while at != -1:
                path.append(fed.tokens[at])
                at = fed.parents[at]
            logits = self.target.forward(torch.tensor(self.context + path[::-1]),
                                         self.target.new_cache()).logits[-1]
            assert rows.next_tokens[node + 1] == int(logits.argmax())
            self.checked += 1
        super().verified(rows)


def test_window_rows_are_the_targets_tokens_and_steps_fit_the_budget(tiny):
    proposer = Checked(tiny, settings=LookaheadSettings(window=3, ngram=3, guesses=2), tree_nodes=7)
    request = tree_request(tiny, PROMPTS[1], SamplingParams(max_new_tokens=10), proposer, k=3,
                           nodes=7)
    while not request.finished:
        item = request.prepare()
        out = tiny.forward(item.tokens, item.cache, positions=item.positions, mask=item.mask)
        request.complete(out)
    assert proposer.checked >= 20 and proposer.iterations >= 4 and proposer.window_grams >= 3


@pytest.mark.parametrize("backend,tree,settings", [
    ("native", None, LookaheadSettings(window=4, ngram=3, guesses=4)),
    ("native", 0, LookaheadSettings(window=3, ngram=4, guesses=3)),
    ("native", 6, LookaheadSettings(window=5, ngram=2, guesses=0)),
    ("hf", None, LookaheadSettings(window=2, ngram=3, guesses=2)),
])
def test_greedy_equality_tiny(backend, tree, settings, tiny, tiny_native):
    target = tiny if backend == "hf" else tiny_native
    engine = Engine(target, tokenizer=CharTokenizer())
    spec = parse_spec(proposer="lookahead", k="auto" if tree == 0 else 6, tree=tree,
                      lookahead_window=settings.window, lookahead_ngram=settings.ngram,
                      lookahead_guesses=settings.guesses)
    drafted = 0
    for prompt in PROMPTS:
        want = engine.generate(prompt, SamplingParams(max_new_tokens=32), PLAIN).token_ids
        got = engine.generate(prompt, SamplingParams(max_new_tokens=32), spec)
        comparison = compare_greedy(target, prompt, want, got.token_ids)
        assert comparison.identical, comparison.describe()
        drafted += got.stats.drafted
    assert drafted > 0


def test_repetitive_text_is_accepted_from_the_window_and_the_prompt():
    """On a target that ends in a loop, the pool soon holds its loop, and the
    Jacobi window alone (G = 0: no pool guesses verified) converges to it, so its
    own level-0 chain is accepted; identical to plain decoding throughout."""
    target = tiny_target(3, layers=1, vocab=12)
    engine = Engine(target)
    prompt = [1, 2, 3, 4, 5]
    want = engine.generate(prompt, SamplingParams(max_new_tokens=60), PLAIN).token_ids
    for guesses, least_tau in ((4, 2.3), (0, 1.3)):
        spec = SpecConfig("lookahead", k=6, lookahead_window=4, lookahead_ngram=3,
                          lookahead_guesses=guesses)
        got = engine.generate(prompt, SamplingParams(max_new_tokens=60), spec)
        assert got.token_ids == want
        assert got.stats.tau > least_tau, (guesses, got.stats.tau)


def test_budget_depth_and_chain_mode():
    proposer = LookaheadProposer(frozenset(), LookaheadSettings(window=4, ngram=4, guesses=4))
    ctx = DraftContext([5, 6, 7, 5, 6, 7, 5], num_prompt=7, tree_nodes=5)
    tree = proposer.propose(ctx, 2).tree
    assert tree.max_depth <= 2 and len(tree) <= 5
    # The prompt's n-grams after the last token 5 are verified, before the window.
    assert tree.token_list[:2] == [6, 7]
    chain = proposer.propose(DraftContext(ctx.tokens, 7, tree_nodes=0), 3)
    assert chain.tree is None and chain.tokens.tolist() == [6, 7, 5]
    assert proposer.propose(ctx, 0).tokens.numel() == 0


def test_registration_settings_and_auto(tiny):
    spec = parse_token("lookahead+lookahead_window=3+lookahead_ngram=4+lookahead_guesses=1")
    assert (spec.lookahead_window, spec.lookahead_ngram, spec.lookahead_guesses) == (3, 4, 1)
    assert spec.tree == (3 + 1) * 3  # tree 0 means the whole step's nodes
    assert parse_spec(proposer="lookahead", tree=8).tree == 8
    with pytest.raises(ValueError, match="lookahead_ngram"):
        SpecConfig("lookahead", lookahead_ngram=1)
    import argparse

    from verispec.cli_args import add_spec_args
    parser = argparse.ArgumentParser()
    add_spec_args(parser)
    args = parser.parse_args(["--proposer", "lookahead", "--lookahead-window", "2",
                              "--lookahead-guesses", "0"])
    assert spec_from(args).lookahead_window == 2 and spec_from(args).lookahead_guesses == 0


@pytest.mark.slow
def test_greedy_equality_default_model(default_engine):
    engine = default_engine
    for prompt in [engine.encode("def fibonacci(n):\n")]:
        want = engine.generate(prompt, SamplingParams(max_new_tokens=24), PLAIN).token_ids
        for spec in (SpecConfig("lookahead", k=6), parse_spec(proposer="lookahead", k="auto")):
            got = engine.generate(prompt, SamplingParams(max_new_tokens=24), spec)
            comparison = compare_greedy(engine.target, prompt, want, got.token_ids)
            assert comparison.identical, comparison.describe()


@pytest.mark.slow
def test_sampled_output_follows_the_target():
    """1000 seeded three-token requests on a vocab-8 target at T = 2 whose prompt
    repeats, so the pool verifies prompt n-grams at the first step and window
    n-grams after: the first and second tokens' marginals pass chi-square against
    the target's exact ones, and drafts are often accepted and often not."""
    target = tiny_target(11, layers=1, vocab=8)
    engine = Engine(target)
    prompt, temperature, runs = [1, 2, 3, 1, 2, 3, 1, 2], 2.0, 1000
    spec = parse_spec(proposer="lookahead", k=2, lookahead_window=3, lookahead_ngram=3, lookahead_guesses=3)
    counts, drafted, accepted = _first_two_counts(engine, prompt, spec, temperature, runs)
    assert drafted >= 2 * runs and 0.1 * runs < accepted < drafted
    assert _worst_pvalue(counts, _exact_marginals(target, prompt, temperature), runs) > 1e-3


def test_concurrent_server_requests_batch_lookahead_trees(tiny):
    """Four clients at once through the continuous-batching scheduler, fixed and
    adaptive k (the batch allocator choosing each request's k): every answer equals
    plain decoding and lookahead drafted."""
    import http.client
    import json
    import threading

    from test_server import ChatCharTokenizer
    from verispec.serving.protocol import ServeDefaults
    from verispec.serving.scheduler import SchedulerConfig
    from verispec.serving.server import ServerConfig, ServerThread, create_app

    engine = Engine(tiny, tokenizer=ChatCharTokenizer())
    prompts = ["abcabcab", "hello hello", "0123401234", "+-+-+-+"]
    want = {p: engine.generate(p, SamplingParams(max_new_tokens=16), PLAIN).text for p in prompts}

    def ask(server, prompt, speculation, out):
        conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0,
                           "speculation": speculation})
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        out[prompt] = json.loads(conn.getresponse().read())
        conn.close()

    config = ServerConfig(("tiny",), ServeDefaults(proposer="lookahead", k=4, adaptive=False),
                          SchedulerConfig(max_num_seqs=4, max_queue=16))
    with ServerThread(create_app(engine, config)) as server:
        for speculation in ({"proposer": "lookahead", "k": 4, "tree": 6},
                            {"proposer": "lookahead", "k": "auto"}):
            out: dict = {}
            threads = [threading.Thread(target=ask, args=(server, p, speculation, out))
                       for p in prompts]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert all("choices" in a for a in out.values()), out
            assert {p: a["choices"][0]["text"] for p, a in out.items()} == want, speculation
            assert sum(a["speculation"]["drafted"] for a in out.values()) > 0


def test_server_takes_lookahead_window_ngram_and_guesses(tiny, monkeypatch):
    """W, N and G in a request's speculation object reach the proposer (the
    settings each request's lookahead was built with are recorded), every answer
    equals plain decoding, and bad values are 400s naming the field."""
    import http.client
    import json

    from test_server import ChatCharTokenizer
    from verispec.serving.protocol import ServeDefaults
    from verispec.serving.scheduler import SchedulerConfig
    from verispec.serving.server import ServerConfig, ServerThread, create_app

    built: list[LookaheadSettings] = []
    init = LookaheadProposer.__init__

    def recording(self, eos, settings=LookaheadSettings(), **kw):
        built.append(settings)
        init(self, eos, settings, **kw)

    monkeypatch.setattr(LookaheadProposer, "__init__", recording)
    engine = Engine(tiny, tokenizer=ChatCharTokenizer())
    prompt = "abcabcabcab"
    want = engine.generate(prompt, SamplingParams(max_new_tokens=16), PLAIN).text

    def post(server, speculation):
        conn = http.client.HTTPConnection(server.host, server.port, timeout=120)
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": 16,
                           "temperature": 0, "speculation": speculation})
        conn.request("POST", "/v1/completions", body=body,
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        answer = json.loads(response.read())
        conn.close()
        return response.status, answer

    config = ServerConfig(("tiny",), ServeDefaults(proposer="ngram", k=4, adaptive=False),
                          SchedulerConfig(max_num_seqs=2, max_queue=8))
    with ServerThread(create_app(engine, config)) as server:
        for w, n, g in ((1, 2, 2), (4, 3, 0), (3, 4, 3)):
            built.clear()
            status, answer = post(server, {"proposer": "lookahead", "lookahead_window": w,
                                           "lookahead_ngram": n, "lookahead_guesses": g})
            assert status == 200, answer
            assert answer["choices"][0]["text"] == want, (w, n, g)
            assert built == [LookaheadSettings(w, n, g)]
        built.clear()
        status, answer = post(server, {"proposer": "lookahead", "lookahead_ngram": 3})
        assert status == 200 and answer["choices"][0]["text"] == want
        assert built == [LookaheadSettings(SpecConfig.lookahead_window, 3,
                                           SpecConfig.lookahead_guesses)]
        bad = [({"proposer": "lookahead", "lookahead_window": 0}, "speculation.lookahead_window"),
               ({"proposer": "lookahead", "lookahead_ngram": 1}, "speculation.lookahead_ngram"),
               ({"proposer": "lookahead", "lookahead_guesses": -1}, "speculation.lookahead_guesses"),
               ({"proposer": "lookahead", "lookahead_window": "4"}, "speculation.lookahead_window"),
               ({"proposer": "lookahead", "lookahead_window": 2.5}, "speculation.lookahead_window"),
               ({"proposer": "lookahead", "lookahead_window": 65}, "speculation.lookahead_window"),
               ({"proposer": "ngram", "lookahead_window": 2}, "speculation.lookahead_window"),
               # (64 + 64) * (16 - 1) nodes a step, unless "tree" caps them
               ({"proposer": "lookahead", "lookahead_window": 64, "lookahead_ngram": 16,
                 "lookahead_guesses": 64}, "speculation")]
        for speculation, param in bad:
            status, answer = post(server, speculation)
            assert status == 400, (speculation, answer)
            assert answer["error"]["param"] == param, (speculation, answer)
        status, answer = post(server, {"proposer": "lookahead", "lookahead_window": 64,
                                       "lookahead_ngram": 16, "lookahead_guesses": 64, "tree": 8})
        assert status == 200 and answer["choices"][0]["text"] == want
