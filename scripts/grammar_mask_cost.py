"""Grammar engines compared on this CPU: the cost of the token mask per
generated token, with the default model's tokenizer (SmolLM2, 49152 tokens).

    python scripts/grammar_mask_cost.py [--repeats 5]

For each JSON schema below, a valid document (keys in schema order) is
tokenized, in two JSON whitespace modes: flexible (each engine's default,
what verispec uses, so the model may indent as it likes; the document is
written with indent=2) and compact (no whitespace allowed), and replayed token
by token through each engine: at every position the engine fills the
next-token bitmask, then accepts the token. Reported: grammar compile time,
median and p95 microseconds per token of (mask + accept), and the cost of a
rollback of 4 tokens (what a rejected speculative block needs). Engines take
turns document by document, so load on the shared machine hits both alike.
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time

SCHEMAS = {
    "person": ({"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"},
        "email": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age", "email", "tags"], "additionalProperties": False},
        {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org",
         "tags": ["mathematics", "poetry", "engines"]}),
    "invoice": ({"type": "object", "properties": {
        "id": {"type": "string"}, "paid": {"type": "boolean"},
        "lines": {"type": "array", "items": {"type": "object", "properties": {
            "item": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}},
            "required": ["item", "qty", "price"], "additionalProperties": False}},
        "currency": {"enum": ["EUR", "USD", "GBP"]}},
        "required": ["id", "paid", "lines", "currency"], "additionalProperties": False},
        {"id": "INV-2041", "paid": False, "lines": [
            {"item": "bolts", "qty": 200, "price": 0.05},
            {"item": "washers", "qty": 150, "price": 0.02}], "currency": "EUR"}),
    "json_object": ({"type": "object"}, {"summary": "a short text", "score": 0.75,
                                         "points": ["one", "two", {"nested": True}]}),
}


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab: int, flexible: bool) -> None:
        import xgrammar as xgr

        self.xgr = xgr
        self.flexible = flexible
        self.compiler = xgr.GrammarCompiler(xgr.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab), cache_enabled=False)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab)

    def compile(self, schema: dict):
        return self.xgr.GrammarMatcher(self.compiler.compile_json_schema(
            json.dumps(schema), any_whitespace=self.flexible), max_rollback_tokens=16)

    def step(self, matcher, token: int) -> None:
        matcher.fill_next_token_bitmask(self.bitmask)
        if not matcher.accept_token(token):
            raise RuntimeError("xgrammar refused a token of a valid document")

    def rollback(self, matcher, n: int) -> None:
        matcher.rollback(n)


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer, vocab: int, flexible: bool) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.flexible = flexible
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
        self.fill = llguidance.torch.fill_next_token_bitmask
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)

    def compile(self, schema: dict):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": self.flexible})
        return self.llg.LLMatcher(self.tokenizer, grammar)

    def step(self, matcher, token: int) -> None:
        self.fill(matcher, self.bitmask, 0)
        if not matcher.consume_token(token):
            raise RuntimeError(f"llguidance refused a token: {matcher.get_error()}")

    def rollback(self, matcher, n: int) -> None:
        matcher.rollback(n)


def measure(engine, schema: dict, tokens: list[int]) -> dict:
    start = time.perf_counter()
    matcher = engine.compile(schema)
    compiled = time.perf_counter() - start
    per_token = []
    for token in tokens:
        start = time.perf_counter()
        try:
            engine.step(matcher, token)
        except RuntimeError:
            return None
        per_token.append(time.perf_counter() - start)
    start = time.perf_counter()
    engine.rollback(matcher, 4)
    rollback = time.perf_counter() - start
    return {"compile": compiled, "tokens": per_token, "rollback": rollback}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from verispec.models.loading import default_gguf_path, gguf_tokenizer

    tokenizer = gguf_tokenizer(default_gguf_path())
    vocab = len(tokenizer)
    print(f"tokenizer: SmolLM2 (default model), {vocab} tokens; {args.repeats} repeats")
    for (name, (schema, document)), flexible in itertools.product(SCHEMAS.items(), (True, False)):
        engines = [Xgrammar(tokenizer, vocab, flexible), Llguidance(tokenizer, vocab, flexible)]
        text = json.dumps(document, indent=2) if flexible else \
            json.dumps(document, separators=(",", ":"))
        tokens = tokenizer.encode(text, add_special_tokens=False)
        rows = {e.name: {"compile": [], "tokens": [], "rollback": []} for e in engines}
        for _ in range(args.repeats):
            for engine in [e for e in engines if rows[e.name] is not None]:
                result = measure(engine, schema, tokens)
                if result is None:
                    rows[engine.name] = None
                    continue
                for key in rows[engine.name]:
                    value = result[key]
                    rows[engine.name][key].extend(value if isinstance(value, list) else [value])
        print(f"\n{name}, {'flexible' if flexible else 'compact'} whitespace: {len(tokens)} tokens")
        for engine_name, row in rows.items():
            if row is None:
                print(f"  {engine_name:11s} refused a token of this valid document")
                continue
            times = sorted(row["tokens"])
            p95 = times[int(0.95 * (len(times) - 1))]
            print(f"  {engine_name:11s} compile {statistics.median(row['compile']) * 1e3:8.1f} ms"
                  f"   mask+accept median {statistics.median(times) * 1e6:7.1f} us"
                  f"  p95 {p95 * 1e6:7.1f} us   rollback(4) "
                  f"{statistics.median(row['rollback']) * 1e6:6.1f} us")


if __name__ == "__main__":
    main()
