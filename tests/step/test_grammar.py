"""Grammar-constrained output under speculation (verispec.step.grammar): output
always parses and validates, greedy speculative output equals greedy plain
constrained output, forced tokens are drafted and accepted, and a draft is cut
before its first forbidden token.

A tiny random model with the default model's tokenizer (49152 tokens) is the
adversary: unconstrained it writes noise, so everything that parses is the
grammar's doing."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch
from conftest import tiny_llama

from verispec import Engine, Grammar, SamplingParams, SpecConfig
from verispec.models.hf import HFModel
from verispec.models.llama import NativeLlama
from verispec.models.loading import default_gguf_path, gguf_tokenizer

VOCAB = 49152
SCHEMAS = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"ok": {"type": "boolean"},
                                      "kind": {"enum": ["alpha", "beta", "gamma"]}},
     "required": ["ok", "kind"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "maxItems": 3,
                                               "items": {"type": "string", "maxLength": 6}}},
     "required": ["tags"], "additionalProperties": False},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"],
        "additionalProperties": False}, "label": {"const": "origin-distance"}},
     "required": ["point", "label"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 1,
     "maxItems": 4},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                                      "note": {"type": ["string", "null"], "maxLength": 8}},
     "required": ["id", "note"], "additionalProperties": False},
]
SPECS = {"plain": SpecConfig("none", k=0), "ngram": SpecConfig("ngram", k=6),
         "same-model": SpecConfig("draft", k=4, draft="same"),
         "random-draft": SpecConfig("draft", k=3, draft="random"),
         "ngram-tree": SpecConfig("ngram", k=4, tree=8)}
PROMPTS = [[1, 520, 33, 9000, 17], [42] * 6, list(range(300, 320))]


@pytest.fixture(scope="module")
def tokenizer():
    return gguf_tokenizer(default_gguf_path())


def _with_eos(model, tokenizer):
    model.eos_token_ids = frozenset({tokenizer.eos_token_id})
    return model


def _engine(target, tokenizer) -> Engine:
    target = _with_eos(target, tokenizer)
    engine = Engine(target, tokenizer=tokenizer)
    engine._drafts["same"] = target
    engine._drafts["random"] = _with_eos(HFModel(tiny_llama(8, vocab=VOCAB, layers=1)), tokenizer)
    return engine


@pytest.fixture(scope="module")
def engine(tokenizer, tmp_path_factory):
    """The native backend: bit-exact, so greedy equality is exact."""
    folder = tmp_path_factory.mktemp("tiny-49k")
    tiny_llama(3, vocab=VOCAB, layers=2).save_pretrained(folder)
    return _engine(NativeLlama.from_dir(folder, dtype=torch.float32), tokenizer)


@pytest.fixture(scope="module")
def hf_engine(tokenizer):
    return _engine(HFModel(tiny_llama(3, vocab=VOCAB, layers=2), name="tiny-49k"), tokenizer)


def _grammar(schema: dict) -> Grammar:
    return Grammar("json_schema", json.dumps(schema))


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_greedy_constrained_output_validates_and_equals_plain(engine, index):
    schema = SCHEMAS[index]
    sampling = SamplingParams(max_new_tokens=160, grammar=_grammar(schema))
    prompt = PROMPTS[index % len(PROMPTS)]
    want = engine.generate(prompt, sampling, SPECS["plain"])
    assert want.finish_reason == "stop", want.text
    jsonschema.validate(json.loads(want.text), schema)
    for name, spec in SPECS.items():
        got = engine.generate(prompt, sampling, spec)
        assert got.token_ids == want.token_ids, (name, got.text, want.text)


def test_hf_backend_constrained_equality(hf_engine):
    schema = SCHEMAS[1]
    sampling = SamplingParams(max_new_tokens=80, grammar=_grammar(schema))
    want = hf_engine.generate(PROMPTS[0], sampling, SPECS["plain"])
    jsonschema.validate(json.loads(want.text), schema)
    for name in ("ngram", "same-model"):
        assert hf_engine.generate(PROMPTS[0], sampling, SPECS[name]).token_ids == want.token_ids


def test_sampled_constrained_output_always_validates(engine):
    for index, schema in enumerate(SCHEMAS):
        for seed, prompt in enumerate(PROMPTS[:2]):
            sampling = SamplingParams(temperature=1.0, seed=seed, max_new_tokens=160,
                                      grammar=_grammar(schema))
            spec = list(SPECS.values())[(index + seed) % len(SPECS)]
            got = engine.generate(prompt, sampling, spec)
            assert got.finish_reason == "stop", got.text
            jsonschema.validate(json.loads(got.text), schema)


def test_unconstrained_tiny_model_writes_no_json(engine):
    """The control: without the grammar the same model's output does not parse."""
    got = engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=40), SPECS["plain"])
    with pytest.raises(ValueError):
        json.loads(got.text)


def test_forced_tokens_are_drafted_and_accepted(engine):
    """A const string is forced: its tokens are drafted one-hot, accepted with
    probability 1, and the output still equals plain constrained decoding."""
    schema = {"type": "object", "properties": {"label": {"const": "a-long-forced-label-value"}},
              "required": ["label"], "additionalProperties": False}
    sampling = SamplingParams(max_new_tokens=80, grammar=_grammar(schema))
    want = engine.generate(PROMPTS[0], sampling, SPECS["plain"])
    request = engine.new_request(PROMPTS[0], sampling, SpecConfig("ngram", k=8))
    tokens = [t for step in _run(engine, request) for t in step.tokens]
    assert tokens == want.token_ids
    assert json.loads(engine.decode(tokens)) == {"label": "a-long-forced-label-value"}
    assert request.constraint.forced_drafts >= 4
    assert request.stats.accepted >= request.constraint.forced_drafts


def test_regex_and_lark_grammars(engine):
    regex = Grammar("regex", r"[A-Z]{2}-\d{3}")
    got = engine.generate(PROMPTS[1], SamplingParams(max_new_tokens=30, grammar=regex),
                          SPECS["ngram"])
    assert re.fullmatch(r"[A-Z]{2}-\d{3}", got.text), got.text
    lark = Grammar("lark", 'start: "yes" | "no"')
    got = engine.generate(PROMPTS[2], SamplingParams(max_new_tokens=10, temperature=1.0, seed=2,
                                                     grammar=lark), SPECS["same-model"])
    assert got.text in ("yes", "no")


def test_draft_is_cut_before_a_forbidden_token(engine, tokenizer):
    from verispec.proposers.base import DraftContext, Proposal
    from verispec.step.grammar import Constraint, constrained_proposal, ll_tokenizer

    constraint = Constraint(Grammar("regex", "ab+c"), ll_tokenizer(tokenizer, VOCAB), VOCAB)

    class Fixed:
        def propose(self, ctx, k):
            ids = tokenizer.encode("abbbcz", add_special_tokens=False)
            return Proposal(torch.tensor(ids[:k]))

    ids = tokenizer.encode("abbbcz", add_special_tokens=False)
    proposal = constrained_proposal(constraint, Fixed(), DraftContext([1, 2], 2), len(ids))
    text = tokenizer.decode(proposal.tokens.tolist())
    assert "abbbc".startswith(text) and "z" not in text
    masks = constraint.masks(proposal.tokens.tolist())  # [k + 1, vocab]
    assert masks.shape == (len(proposal) + 1, VOCAB)
    assert not masks[0, tokenizer.encode("z", add_special_tokens=False)[0]]


def test_bad_grammars_fail_cleanly(engine):
    for bad in (Grammar("regex", "(unclosed"), Grammar("json_schema", '{"type": "nonsense"}')):
        with pytest.raises(ValueError):
            engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=4, grammar=bad),
                            SPECS["plain"])
    with pytest.raises(ValueError):
        Grammar("yaml", "x")


def _run(engine, request):
    from verispec.request import run_alone
    return run_alone(engine.target, request)


def test_default_model_fills_schemas(default_engine):
    """The default model, constrained, on real prompts: every answer validates."""
    cases = [
        ("Describe a fictional person.", SCHEMAS[0]),
        ("Is water wet? Answer with ok and a kind.", SCHEMAS[1]),
        ("Give three short tags for a cooking blog.", SCHEMAS[2]),
        ("Write a JSON object with two short keys about the weather.", None),
    ]
    for i, (prompt, schema) in enumerate(cases):
        grammar = Grammar("json_object") if schema is None else _grammar(schema)
        sampling = SamplingParams(max_new_tokens=256, grammar=grammar, temperature=0.7 * (i % 2),
                                  seed=i)
        ids = default_engine.encode(prompt, chat=True)
        got = default_engine.generate(ids, sampling, SpecConfig("ngram", k=6))
        assert got.finish_reason == "stop", got.text
        value = json.loads(got.text)
        if schema is None:
            assert isinstance(value, dict)
        else:
            jsonschema.validate(value, schema)


def test_a_grammar_that_gives_up_mid_output_stops_the_request(tokenizer):
    """llguidance reports a resource limit by entering its error state and filling
    empty masks; an empty mask must not read as the grammar's end (which allows
    every token), or the constraint would silently lift."""
    import llguidance

    from verispec.step.grammar import Constraint, GrammarLimitError, ll_tokenizer

    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "tags": {"type": "array", "items": {"type": "string"}}}}
    ids = tokenizer.encode('{"name": "abc"}', add_special_tokens=False)
    tight = llguidance.LLParserLimits(step_max_items=30)
    constraint = Constraint(_grammar(schema), ll_tokenizer(tokenizer, VOCAB), VOCAB, limits=tight)
    with pytest.raises(GrammarLimitError, match="Too many items"):
        for i in range(len(ids)):
            masks = constraint.masks([])  # [1, vocab]
            assert not bool(masks.all()), f"the constraint lifted after {i} tokens"
            constraint.commit(ids[i: i + 1])
    roomy = Constraint(_grammar(schema), ll_tokenizer(tokenizer, VOCAB), VOCAB)
    for token in ids:
        assert not bool(roomy.masks([]).all())
        roomy.commit([token])


# At llguidance's step_max_items=20 the integer branch fits, but the object branch's
# state inside its first string value ({"name": ") exceeds the limit.
BRANCHES = {"anyOf": [{"type": "integer"}, {
    "type": "object", "properties": {"name": {"type": "string"},
                                     "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["name", "tags"], "additionalProperties": False}]}


def test_a_draft_past_the_limits_costs_the_draft_not_the_request(engine, tokenizer, monkeypatch):
    """llguidance's error state is sticky: an n-gram draft into the object branch
    used to take the whole request down with it (the LangChain failure under
    adaptive k). The target never opens an object here (logit_bias), so plain
    decoding never meets the limit; speculation must not either, and must give
    plain decoding's output."""
    from verispec.step import grammar
    from verispec.step.grammar import GrammarLimitError

    monkeypatch.setitem(grammar.LIMITS, "step_max_items", 20)
    prompt = tokenizer.encode('x\n{"name": "ab", "tags": []}\nx\n', add_special_tokens=False)
    braces = {i: -100.0 for t, i in tokenizer.get_vocab().items() if t.startswith("{")}
    sampling = SamplingParams(max_new_tokens=12, logit_bias=braces, grammar=_grammar(BRANCHES))
    want = engine.generate(prompt, sampling, SPECS["plain"])
    request = engine.new_request(prompt, sampling, SpecConfig("ngram", k=6))
    tokens = [t for step in _run(engine, request) for t in step.tokens]
    assert tokens == want.token_ids
    assert request.constraint.restores >= 1, "no draft reached the limit: the test proves nothing"
    assert "{" not in engine.decode(tokens)  # the integer branch
    # The state the draft reached fails the request only when the output goes through it.
    constraint = grammar.Constraint(_grammar(BRANCHES), engine._ll_tokenizer, VOCAB)
    opening = tokenizer.encode('{"name": "', add_special_tokens=False)
    assert constraint.allowed_prefix(opening) == len(opening)
    masks = constraint.masks(opening)  # [k + 1, vocab]
    assert not bool(masks[:-1].all(-1).any()) and bool(masks[-1].all())
    past = grammar.Constraint(_grammar(BRANCHES), engine._ll_tokenizer, VOCAB)
    assert past.allowed_prefix(opening + opening) == len(opening)  # no draft after that one
    past.masks(opening)
    with pytest.raises(GrammarLimitError, match="Too many items"):
        past.commit(opening + opening[:1])  # as if the bonus were drawn from the failed row
    constraint.commit(opening)  # up to the failed state: plain decoding gets here too
    with pytest.raises(GrammarLimitError, match="Too many items"):
        constraint.allowed_prefix([])


def test_a_drafted_eos_after_a_grammar_that_ended_by_itself_rolls_back(engine, tokenizer):
    """llguidance keeps no rollback entry for an EOS consumed once its grammar has
    stopped by itself (a literal, after its last byte): rolling the drafts back by
    their count took a committed token with it, and the next commit was refused."""
    from verispec.step.grammar import Constraint

    literal = Grammar("lark", 'start: "It is 18 C."')
    ids = tokenizer.encode("It is 18 C.", add_special_tokens=False)
    eos = tokenizer.eos_token_id
    constraint = Constraint(literal, engine._ll_tokenizer or _ll(engine), VOCAB)
    constraint.commit(ids[:-2])
    assert constraint.allowed_prefix(ids[-2:] + [eos]) == 3
    constraint.masks(ids[-2:] + [eos])
    constraint.commit(ids[-2:] + [eos])
    # Through the engine: the n-gram proposer drafts EOS after the forced "." (the chat
    # prompt has ".<|im_end|>"), and the output is plain decoding's.
    prompt = engine.encode_messages([{"role": "user", "content": "Tell me about a city."}])
    sampling = SamplingParams(max_new_tokens=40, grammar=literal)
    want = engine.generate(prompt, sampling, SPECS["plain"])
    got = engine.generate(prompt, sampling, SpecConfig("ngram", k=4))
    assert got.text == want.text == "It is 18 C." and got.token_ids == want.token_ids


def _ll(engine):
    engine.constraint(SamplingParams(grammar=Grammar("json_object")))  # builds llguidance's tokenizer
    return engine._ll_tokenizer


def test_a_regex_digit_class_is_unicode_and_an_ascii_class_is_not(tokenizer):
    """The regex dialect is llguidance's (Rust `regex`): `\\d` takes every Unicode decimal
    digit, spelled by byte tokens, including U+16133 (Unicode 16); `[0-9]` takes ASCII only
    (docs/structured_outputs.md). The server's tests check with `[0-9]` for this reason."""
    from verispec.step.grammar import Constraint, ll_tokenizer

    ll = ll_tokenizer(tokenizer, VOCAB)
    for text, unicode_ok in (("51", True), ("8\u0663", True), ("8\U00016133", True),
                             ("8a", False)):
        ids = tokenizer.encode(text, add_special_tokens=False)
        for pattern, ok in ((r"\d{2}", unicode_ok), (r"[0-9]{2}", text.isascii() and unicode_ok)):
            accepted = Constraint(Grammar("regex", pattern), ll, VOCAB).allowed_prefix(ids)
            assert (accepted == len(ids)) == ok, (pattern, text, ids, accepted)


def test_grammar_holds_inside_a_predicted_block(tmp_path):
    """A tiny model on the default tokenizer under a JSON schema: the prediction is the
    answer (drafted and accepted inside the grammar) or an answer the grammar
    forbids (cut before its first forbidden token); either way plain output."""
    from verispec.models.hf import HFModel
    from verispec.models.loading import default_gguf_path, gguf_tokenizer

    engine = _engine(HFModel(tiny_llama(3, vocab=VOCAB, layers=2), name="tiny-49k"),
                     gguf_tokenizer(default_gguf_path()))
    sampling = SamplingParams(max_new_tokens=80, grammar=Grammar("json_schema",
                                                                 json.dumps(SCHEMAS[1])))
    prompt = [1, 520, 33, 9000, 17]
    want = engine.generate(prompt, sampling, SPECS["plain"])
    # The answer's own ids (its text would tokenize its whitespace runs otherwise).
    for prediction, accepted in ((want.token_ids, True), (want.text, False),
                                 (want.text.replace("true", "nope"), False),
                                 ('{"ok": maybe}', False)):
        got = engine.generate(prompt, sampling, SPECS["ngram"], prediction=prediction)
        assert got.token_ids == want.token_ids, prediction
        if accepted:
            assert got.stats.prediction_accepted >= len(want.token_ids) // 2
