"""Replays prediction drafting on a bench's stored greedy outputs, without the clock:
target passes at a fixed k for n-gram lookup alone, the prediction first whenever it is
aligned (the first rule), and the prediction only while its run is at least the n-gram
match (the committed rule: proposers/prediction.py). A draft keeps its prefix that
matches the stored output, as greedy verification does, so the pass counts equal the
engine's (checked against the bench's own counts for the first two).

    PYTHONPATH=$PWD python3 docs/notebook/predicted_outputs/replay_rule.py \
        docs/results/predicted_edit/results.json 8
"""
import json
import sys

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


def main(path, k):
    tokenizer = gguf_tokenizer(default_gguf_path())
    prompts = {p.id: p for p in load_workload("predicted-edit")}
    records = json.load(open(path))["records"]
    bench = {(r["prompt_id"], r["config"]): r["target_forwards"] for r in records}
    print("| prompt | tokens | ngram (bench) | aligned first (bench) | longer match wins |")
    print("|---|---|---|---|---|")
    for record in records:
        if record["config"] != "none":
            continue
        prompt = prompts[record["prompt_id"]]
        ids = chat_ids(tokenizer, list(prompt.messages))
        predicted = prediction_ids(tokenizer, prompt.prediction)
        output = record["token_ids"]

        def ngram():
            return NgramProposer(1, 4, frozenset())

        counts = [passes(ids, output, ngram(), k),
                  passes(ids, output, AlignedFirst(predicted, frozenset(), ngram()), k),
                  passes(ids, output, PredictionProposer(predicted, frozenset(), ngram()), k)]
        cells = [f"{len(output) / c:.2f} ({bench.get((prompt.id, name), '-')})"
                 for c, name in zip(counts[:2], ("ngram", "ngram+prediction"))]
        print(f"| {prompt.id} | {len(output)} | {' | '.join(cells)} | "
              f"{len(output) / counts[2]:.2f} |")
    print(f"\ntokens per pass at k={k}; in brackets the bench's own target passes")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 8)
