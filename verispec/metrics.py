"""Per-request speculation statistics: what was drafted, what the verifier
kept, how many target passes it took, and where the time went."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

PREDICTION = "prediction"  # the proposer name of a predicted output's drafts (proposers.prediction)


@dataclass
class StepRecord:
    proposer: str
    k: int  # draft length asked for this step
    drafted: int  # draft tokens actually proposed (<= k)
    accepted: int  # of those, kept by the verifier
    emitted: int  # tokens committed this step (accepted + 1, fewer when a stop cut the block)
    evidence: int | None = None  # the proposer's evidence key behind an adaptive k (policy/adaptive.py)
    # Provenance (step/rejection.py's glossary): when emitted == accepted + 1, the last token
    # is the bonus token if `bonus`, else the recovered one; `rejected` holds the drafts
    # the verifier discarded (chain: drafts[accepted:]; tree: the last accepted node's children).
    bonus: bool = False
    rejected: tuple[int, ...] = ()


@dataclass
class Stats:
    proposer: str
    k: int
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    target_forwards: int = 0  # decode passes of the target; the prefill is not counted
    prompt_tokens: int = 0
    time_prefill: float = 0.0
    time_draft: float = 0.0
    time_verify: float = 0.0  # the target forward plus the rejection sampler
    time_total: float = 0.0
    # Under a grammar: time inside the grammar engine (part of draft and verify time)
    # and the grammar-forced tokens drafted (verispec.step.grammar.Constraint).
    time_grammar: float = 0.0
    grammar_forced: int = 0
    finish_reason: str = ""
    lossy: bool = False  # typical acceptance (SpecConfig.lossy_typical): not the model's distribution
    adaptive: bool = False  # k chosen per step (then `k` is the cap; steps hold each choice)
    weights: str = ""  # the target's weights: "quant" / "quant-i8" (GGUF blocks in the kernels) or "dense"
    backend: str = ""  # set where --backend auto fell back to transformers, with the reason
    # A request with a predicted output (proposers.prediction): its drafts that were
    # kept and discarded, OpenAI's accepted / rejected_prediction_tokens.
    predicted: bool = False
    prediction_accepted: int = 0
    prediction_rejected: int = 0
    steps: list[StepRecord] = field(default_factory=list)

    def record(self, step: StepRecord) -> None:
        self.steps.append(step)
        self.drafted += step.drafted
        self.accepted += step.accepted
        self.generated += step.emitted
        self.target_forwards += 1
        if step.proposer == PREDICTION:
            self.prediction_accepted += step.accepted
            self.prediction_rejected += step.drafted - step.accepted

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tau(self) -> float:
        """Tokens committed per target forward (mean accepted tokens, MAT)."""
        return self.generated / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.generated / self.time_total if self.time_total > 0 else 0.0

    @property
    def time_other(self) -> float:
        return max(0.0, self.time_total - self.time_prefill - self.time_draft - self.time_verify)

    @property
    def mean_k(self) -> float:
        """Draft length asked per target pass, averaged over the steps."""
        return sum(s.k for s in self.steps) / len(self.steps) if self.steps else 0.0

    @property
    def acceptance_histogram(self) -> dict[int, int]:
        """Steps by number of accepted draft tokens."""
        return dict(sorted(Counter(s.accepted for s in self.steps if s.drafted).items()))

    def to_dict(self) -> dict:
        return {
            "proposer": self.proposer,
            "k": self.k,
            "adaptive": self.adaptive,
            "mean_k": round(self.mean_k, 3),
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tau": round(self.tau, 4),
            "target_forwards": self.target_forwards,
            "generated_tokens": self.generated,
            "prompt_tokens": self.prompt_tokens,
            "tokens_per_s": round(self.tokens_per_s, 2),
            "time_s": {
                "prefill": round(self.time_prefill, 4),
                "draft": round(self.time_draft, 4),
                "verify": round(self.time_verify, 4),
                "other": round(self.time_other, 4),
                "total": round(self.time_total, 4),
            },
            **({"grammar": {"time_s": round(self.time_grammar, 4),
                            "forced_drafts": self.grammar_forced}} if self.time_grammar else {}),
            "acceptance_histogram": {str(k): v for k, v in self.acceptance_histogram.items()},
            "finish_reason": self.finish_reason,
            "lossy": self.lossy,
            **({"prediction": {"accepted": self.prediction_accepted,
                               "rejected": self.prediction_rejected}} if self.predicted else {}),
            **({"weights": self.weights} if self.weights else {}),
            **({"backend": self.backend} if self.backend else {}),
        }

    def format_line(self) -> str:
        total = self.time_total or 1.0
        split = "/".join(f"{100 * t / total:.0f}%" for t in (
            self.time_prefill, self.time_draft, self.time_verify, self.time_other))
        k = f"auto<={self.k} (mean {self.mean_k:.1f})" if self.adaptive else str(self.k)
        return (f"[verispec] proposer={self.proposer} k={k} drafted={self.drafted} "
                f"accepted={self.accepted} acceptance={100 * self.acceptance_rate:.1f}% "
                f"tau={self.tau:.2f} target_forwards={self.target_forwards} "
                f"tokens={self.generated} tok/s={self.tokens_per_s:.1f} "
                f"time prefill/draft/verify/other={split} ({total:.2f}s)"
                + (f" prediction accepted={self.prediction_accepted} "
                   f"rejected={self.prediction_rejected}" if self.predicted else "")
                + (f" weights={self.weights}" if self.weights else "")
                + (f" backend={self.backend}" if self.backend else "")
                + (" LOSSY (typical acceptance)" if self.lossy else ""))
