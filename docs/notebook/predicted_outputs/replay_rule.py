"""Replays prediction drafting on a bench's stored greedy outputs, without the clock:
target passes at a fixed k for n-gram lookup alone, the prediction first whenever it is
aligned (the first rule), and the prediction only while its run is at least the n-gram
match (the committed rule: proposers/prediction.py). A draft keeps its prefix that
matches the stored output, as greedy verification does, so the pass counts equal the
engine's: in brackets, the bench's own counts for n-gram lookup and for the bench's
`ngram+prediction`, which ran the aligned-first rule in the first round and runs the
committed rule since (its bracket follows the column it ran: `--bench-rule`).

    PYTHONPATH=$PWD python3 docs/notebook/predicted_outputs/replay_rule.py \
        docs/results/predicted_edit/results.json 8 [--bench-rule=aligned]
"""
import json
import sys
from pathlib import Path

from verispec.bench.workloads import load_workload
from verispec.models.loading import default_gguf_path, gguf_tokenizer
from verispec.prompt_ids import chat_ids, prediction_ids
from verispec.proposers.base import DraftContext
from verispec.proposers.ngram import NgramProposer
from verispec.proposers.prediction import PredictionProposer


class AlignedFirst(PredictionProposer):
    """The first rule: the prediction drafts whenever it is aligned."""

    def _leads(self, ctx):
        self.alignment.follow(ctx.tokens[ctx.num_prompt:])
        return bool(self.alignment.continuation(1))


def passes(prompt, output, proposer, k):
    tokens, count, done = list(prompt), 0, 0
    while done < len(output):
        draft = proposer.propose(DraftContext(tokens, len(prompt)), k).tokens.tolist()
        kept = 0
        while kept < len(draft) and done + kept < len(output) \
                and draft[kept] == output[done + kept]:
            kept += 1
        step = output[done:done + kept + 1]
        tokens += step
        done += len(step)
        count += 1
    return count


def plain_answers(tokenizer, records):
    """(prompt, prompt ids, prediction ids, plain greedy output) of each plain record."""
    prompts = {p.id: p for p in load_workload("predicted-edit")}
    for record in records:
        if record["config"] == "none":
            prompt = prompts[record["prompt_id"]]
            yield (prompt, chat_ids(tokenizer, list(prompt.messages)),
                   prediction_ids(tokenizer, prompt.prediction), record["token_ids"])


def main(path, k, bench_rule):
    tokenizer = gguf_tokenizer(default_gguf_path())
    records = json.loads(Path(path).read_text())["records"]
    bench = {(r["prompt_id"], r["config"]): r["target_forwards"] for r in records}
    print("| prompt | tokens | ngram | aligned first | longer match wins |")
    print("|---|---|---|---|---|")
    for prompt, ids, predicted, output in plain_answers(tokenizer, records):

        def ngram():
            return NgramProposer(1, 4, frozenset())

        counts = [passes(ids, output, ngram(), k),
                  passes(ids, output, AlignedFirst(predicted, frozenset(), ngram()), k),
                  passes(ids, output, PredictionProposer(predicted, frozenset(), ngram()), k)]
        ran = {0: "ngram", bench_rule: "ngram+prediction"}
        cells = [f"{len(output) / c:.2f}" + (f" ({bench.get((prompt.id, ran[i]), '-')})"
                                             if i in ran else "")
                 for i, c in enumerate(counts)]
        print(f"| {prompt.id} | {len(output)} | {' | '.join(cells)} |")
    print(f"\ntokens per pass at k={k}; in brackets the bench's own target passes")


if __name__ == "__main__":
    rule = 1 if "--bench-rule=aligned" in sys.argv else 2
    args = [a for a in sys.argv[1:] if not a.startswith("--bench-rule")]
    main(args[0], int(args[1]) if len(args) > 1 else 8, rule)
