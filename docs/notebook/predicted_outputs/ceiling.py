"""Issue 43's 3x goal, without the clock: on a bench's stored greedy outputs (plain, one per
prompt), what share of each answer copies the prediction, what adaptive k with a longer
draft for an aligned prediction would gain, and what no lookup drafting can beat.

Per prompt:
  copied    share of output tokens in runs of >= 4 tokens that match the prediction
            (difflib's matching blocks), i.e. what a perfect alignment could draft
  repeats   share of output 8-grams that occurred earlier in the output (repetition
            loops: n-gram lookup's ground, not the prediction's)
  adaptive  the engine's AdaptiveK (the real policy, fed the profile's T(n)/T(1) as its
            clock) on n-gram lookup alone, then with the prediction drafting first with
            its depth capped at 8, 16 and 32 (the request's own proposer stays at 8), and
            with the room of a prediction step set to the run it has followed (at least 8,
            at most the profile's widest n);
            each cell: tokens per pass / estimated decode speedup (tokens over the sum of
            T(k + 1)/T(1) of the passes)
  oracle    a drafter that knows the answer drafts the longest copy of what comes next
            found anywhere in the prompt, the prediction and the output so far (or in
            the prediction alone), at the k with the best tokens per T(k + 1): the ceiling
            of any drafting by lookup, with no rejected draft ever paid for

    PYTHONPATH=$PWD python3 docs/notebook/predicted_outputs/ceiling.py \
        RESULTS.json PROFILE.json
"""
import difflib
import json
import sys
from pathlib import Path

from replay_rule import plain_answers  # this folder, first on the path of a script run

from verispec.models.loading import default_gguf_path, gguf_tokenizer
from verispec.policy.adaptive import AdaptiveK
from verispec.policy.economics import load_profile
from verispec.policy.plan import Outcome, PlanContext
from verispec.proposers.base import DraftContext
from verispec.proposers.ngram import NgramProposer
from verispec.proposers.prediction import PredictionProposer

K = 8
CAPS = (8, 16, 32, None)  # None: the room of a prediction step is the run it followed


def cost_curve(profile_path):
    profile = json.loads(Path(profile_path).read_text())
    relative, t1 = profile["relative"], profile["t1_ms"] / 1e3
    slope = (relative[-1] - relative[-9]) / 8

    def cost(n):
        return relative[n - 1] if n <= len(relative) else relative[-1] + (n - len(relative)) * slope
    return cost, len(relative), t1


def copied_and_repeats(output, predicted):
    blocks = difflib.SequenceMatcher(None, output, predicted, autojunk=False).get_matching_blocks()
    copied = sum(b.size for b in blocks if b.size >= 4)
    seen, repeats = set(), 0
    for end in range(8, len(output) + 1):
        gram = tuple(output[end - 8:end])
        repeats += gram in seen
        seen.add(gram)
    return copied / len(output), repeats / max(1, len(output) - 7)


def adaptive(prompt, output, proposer, depth, room_of, clock, profile_path):
    """Passes and summed T(n)/T(1) of the real policy drafting `proposer` on `output`."""
    policy = AdaptiveK(depth, load_profile(profile_path))
    tokens, done, passes, seconds = list(prompt), 0, 0, 0.0
    while done < len(output):
        ctx = DraftContext(tokens, len(prompt))
        plan = policy.plan(PlanContext(ctx, proposer), min(room_of(ctx), len(output) - done))
        draft = proposer.propose(ctx, plan.k).tokens.tolist() if plan.k else []
        kept = 0
        while kept < len(draft) and draft[kept] == output[done + kept]:
            kept += 1
        step = output[done:done + kept + 1]
        shadow = None
        if not plan.k and plan.shadow:
            guess = proposer.propose(ctx, 1).tokens.tolist()
            shadow = int(bool(guess) and guess[0] == step[0])
        tokens += step
        done, passes = done + len(step), passes + 1
        cost, t1 = clock
        relative = cost(len(draft) + 1)
        seconds += relative
        policy.observe(plan, Outcome(len(draft), len(draft), kept, kept < len(draft),
                                     shadow=shadow, verify_seconds=relative * t1))
    return passes, seconds


def oracle(text_of, output, cost, widest):
    seconds, done = 0.0, 0
    while done < len(output):
        text, future = text_of(done), output[done:]
        longest = 0
        for i, token in enumerate(text):
            if token != future[0]:
                continue
            n = 1
            while n < widest - 1 and i + n < len(text) and n < len(future) \
                    and text[i + n] == future[n]:
                n += 1
            longest = max(longest, n)
        longest = min(longest, len(future) - 1)
        k = max(range(longest + 1), key=lambda k: (k + 1) / cost(k + 1))
        seconds, done = seconds + cost(k + 1), done + k + 1
    return seconds


def main(results_path, profile_path):
    cost, widest, t1 = cost_curve(profile_path)
    tokenizer = gguf_tokenizer(default_gguf_path())
    columns = ["ngram"] + [f"pred k<={c}" if c else "pred room=run" for c in CAPS] + \
        ["oracle: all text", "oracle: prediction"]
    print("| prompt | tokens | copied | repeats | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 4) + "|")
    totals = [0.0] * (2 * len(columns) + 3)
    records = json.loads(Path(results_path).read_text())["records"]
    for prompt, ids, predicted, output in plain_answers(tokenizer, records):
        copied, repeats = copied_and_repeats(output, predicted)
        cells = []
        ngram = NgramProposer(1, 4, frozenset())
        cells.append(adaptive(ids, output, ngram, K, lambda ctx: K, (cost, t1), profile_path))
        for cap in CAPS:
            proposer = PredictionProposer(predicted, frozenset(), NgramProposer(1, 4, frozenset()))

            def room(ctx, cap=cap, proposer=proposer):
                if not proposer._leads(ctx):
                    return K
                return cap if cap else min(widest, max(K, proposer.alignment.run))
            cells.append(adaptive(ids, output, proposer, cap or widest, room, (cost, t1),
                                  profile_path))
        everything = ids + predicted
        cells.append((None, oracle(lambda done, base=everything, out=output: base + out[:done],
                                   output, cost, widest)))
        cells.append((None, oracle(lambda done, base=predicted: base, output, cost, widest)))
        n = len(output)
        text = [f"{n / p:.2f}/{n / s:.2f}x" if p else f"{n / s:.2f}x" for p, s in cells]
        print(f"| {prompt.id.removeprefix('predicted-edit-')} | {n} | {copied:.2f} | "
              f"{repeats:.2f} | " + " | ".join(text) + " |", flush=True)
        totals[0] += n
        totals[1] += copied * n
        totals[2] += repeats * n
        for i, (p, s) in enumerate(cells):
            totals[3 + 2 * i] += p or 0
            totals[4 + 2 * i] += s
    n = totals[0]
    text = [f"{n / totals[3 + 2 * i]:.2f}/{n / totals[4 + 2 * i]:.2f}x" if totals[3 + 2 * i]
            else f"{n / totals[4 + 2 * i]:.2f}x" for i in range(len(columns))]
    print(f"| all | {n:.0f} | {totals[1] / n:.2f} | {totals[2] / n:.2f} | " + " | ".join(text) + " |")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
