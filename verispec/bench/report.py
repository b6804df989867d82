"""From raw per-prompt records to the numbers a reader compares: one row per
workload and configuration, a k-sweep table, Markdown and JSON.

Aggregation rules (each chosen so a short, noisy run still means something):
  tokens/s  median over prompts: one slow prompt (a GC pause, a neighbour)
            does not move it
  speedup   median of per-prompt ratios against the reference on the same
            prompt, so prompt difficulty cancels before aggregation
  cpu speedup  the same with CPU seconds of the process instead of wall seconds:
            time that other tenants of a shared machine took the cores is not in
            it, so at one thread it is the steadier estimate of a quiet machine's
            speedup (memory-bandwidth contention still is in it)
  decode speedup  the same with prefill excluded, against verispec's own plain
            run: the draft length cannot change a prompt's prefill, and on long
            documents its noise swamps the decode differences the k sweep is about
  alpha     total accepted / total drafted (a pooled rate, not a mean of rates)
  tau       total generated / total target forwards
  E         (1 - alpha^(k+1)) / (1 - alpha), what tau would be if acceptances
            were i.i.d. with rate alpha (Leviathan et al. 2023, eq. 1)
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from verispec.bench.calculator import expected_tokens
from verispec.bench.configs import PEER, BenchConfig
from verispec.bench.runner import RunRecord


@dataclass
class Equality:
    identical: int = 0
    near_tie: int = 0
    mismatch: int = 0

    @property
    def checked(self) -> int:
        return self.identical + self.near_tie + self.mismatch

    def add(self, status: str | None) -> None:
        if status == "identical":
            self.identical += 1
        elif status == "near-tie":
            self.near_tie += 1
        elif status == "mismatch":
            self.mismatch += 1


@dataclass
class Row:
    workload: str
    config: str
    name: str
    kind: str
    k: int
    prompts: int
    tokens: int  # total new tokens over the prompts
    tokens_per_s: float  # median over prompts
    speedup: float | None  # median per-prompt ratio over `reference`
    reference: str | None
    alpha: float | None
    tau: float | None
    expected_tau: float | None
    time_split: dict[str, float] | None  # fractions of verispec's own total time
    vs_plain: Equality = field(default_factory=Equality)
    vs_hf_plain: Equality = field(default_factory=Equality)
    own_reference: str | None = None  # BenchConfig.own_reference: vs_plain is against it
    decode_speedup: float | None = None  # median per-prompt decode-rate ratio over plain
    cpu_speedup: float | None = None  # median per-prompt ratio of tokens per CPU second


@dataclass
class SweepRow:
    workload: str
    name: str
    ks: list[int]
    tokens_per_s: list[float]
    tau: list[float | None]
    speedup: list[float | None]
    best_k: int
    adaptive: float | None = None  # the `+auto` run's score, if one ran
    adaptive_vs_best: float | None = None  # that score over the best static k's
    decode_speedup: list[float | None] = field(default_factory=list)
    scored_by: str = "speedup"  # the metric that picks the best k: decode speedup, speedup, tok/s


def reference_label(configs: Sequence[BenchConfig]) -> str | None:
    """hf-plain when it ran, else verispec's own plain loop, else nothing."""
    labels = [c.label for c in configs]
    if "hf-plain" in labels:
        return "hf-plain"
    return next((c.label for c in configs if c.is_plain), None)


def _expected(alpha: float | None, k: int) -> float | None:
    if alpha is None or k < 1:
        return None
    return float(k + 1) if alpha >= 1.0 else expected_tokens(alpha, k)


def _median_ratio(records: list[RunRecord], reference: dict[str, RunRecord] | None,
                  rate) -> float | None:
    """Median over prompts of rate(record) / rate(reference's record)."""
    if reference is None:
        return None
    ratios = []
    for r in records:
        ref = reference.get(r.prompt_id)
        mine, theirs = rate(r), rate(ref) if ref is not None else None
        if mine is not None and theirs:
            ratios.append(mine / theirs)
    return statistics.median(ratios) if ratios else None


def _row(workload: str, config: BenchConfig, records: list[RunRecord],
         reference: dict[str, RunRecord] | None, ref_label: str | None,
         plain: dict[str, RunRecord] | None = None) -> Row:
    speedup = _median_ratio(records, reference, lambda r: r.tokens_per_s)
    tau = split = None
    # llama-server reports its draft counts too, not its forwards.
    drafted = sum(r.drafted or 0 for r in records)
    alpha = sum(r.accepted or 0 for r in records) / drafted if drafted else None
    if config.kind != PEER:
        forwards = sum(r.target_forwards or 0 for r in records)
        tau = sum(r.tokens for r in records) / forwards if forwards else None
        total = sum(r.time_split.total for r in records if r.time_split)
        if total > 0:
            split = {part: sum(getattr(r.time_split, part) for r in records if r.time_split) / total
                     for part in ("prefill", "draft", "verify", "other")}
    row = Row(workload, config.label, config.name, config.kind, config.k, len(records),
              sum(r.tokens for r in records), statistics.median(r.tokens_per_s for r in records),
              speedup, ref_label, alpha, tau, _expected(alpha, config.k), split,
              own_reference=config.own_reference,
              decode_speedup=_median_ratio(records, plain, lambda r: r.decode_tokens_per_s),
              cpu_speedup=_median_ratio(records, reference, lambda r: r.cpu_tokens_per_s))
    for r in records:
        row.vs_plain.add(r.vs_plain)
        row.vs_hf_plain.add(r.vs_hf_plain)
    return row


def summarize(records: Sequence[RunRecord], configs: Sequence[BenchConfig]) -> list[Row]:
    ref_label = reference_label(configs)
    plain_label = next((c.label for c in configs if c.is_plain), None)
    workloads = list(dict.fromkeys(r.workload for r in records))
    rows = []
    for workload in workloads:
        mine = [r for r in records if r.workload == workload]
        reference = ({r.prompt_id: r for r in mine if r.config == ref_label}
                     if ref_label is not None else None)
        plain = ({r.prompt_id: r for r in mine if r.config == plain_label}
                 if plain_label is not None else None)
        # Peers skip grammar-constrained prompts: there verispec's plain run is the reference.
        ref = ref_label
        if not reference and plain:
            reference, ref = plain, plain_label
        for config in configs:
            runs = [r for r in mine if r.config == config.label]
            if runs:
                rows.append(_row(workload, config, runs, reference, ref, plain))
    return rows


def sweep(rows: Sequence[Row], configs: Sequence[BenchConfig]) -> list[SweepRow]:
    """Per workload and speculative proposer, the metrics by k and the best
    static k: by decode speedup when verispec's plain run is there, else by
    speedup when a reference ran, else by tokens/s."""
    names = list(dict.fromkeys(c.name for c in configs if c.speculative))
    out = []
    for workload in dict.fromkeys(r.workload for r in rows):
        for name in names:
            mine = sorted((r for r in rows if r.workload == workload and r.name == name
                           and r.kind != PEER), key=lambda r: r.k)
            if len(mine) < 2:
                continue
            by = next(m for m, attr in (("decode speedup", "decode_speedup"),
                                        ("speedup", "speedup"), ("tok/s", "tokens_per_s"))
                      if all(getattr(r, attr) is not None for r in mine))
            attr = _SCORES[by]
            score = [getattr(r, attr) for r in mine]
            top = max(range(len(mine)), key=score.__getitem__)
            auto = next((r for r in rows if r.workload == workload and r.name == f"{name}+auto"
                         and r.kind != PEER), None)
            auto_score = None if auto is None else getattr(auto, attr)
            out.append(SweepRow(workload, name, [r.k for r in mine],
                                [r.tokens_per_s for r in mine], [r.tau for r in mine],
                                [r.speedup for r in mine], mine[top].k, auto_score,
                                None if auto_score is None or not score[top]
                                else auto_score / score[top],
                                [r.decode_speedup for r in mine], by))
    return out


_SCORES = {"decode speedup": "decode_speedup", "speedup": "speedup", "tok/s": "tokens_per_s"}


def _f(value: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{suffix}"


def _equality(eq: Equality) -> str:
    if not eq.checked:
        return "–"
    cell = f"{eq.identical}/{eq.checked}"
    if eq.near_tie:
        cell += f", {eq.near_tie} tie"
    if eq.mismatch:
        cell += f", **{eq.mismatch} diff**"
    return cell


def _equality_cells(row: Row) -> tuple[str, str]:
    """The = plain and = hf-plain cells. A row on other weights is never compared
    with verispec or transformers; its = plain is against its own plain run."""
    if row.own_reference is None:
        return _equality(row.vs_plain), _equality(row.vs_hf_plain)
    na = "n/a (another function)"
    if row.own_reference == row.config or not row.vs_plain.checked:
        return na, na
    return f"{_equality(row.vs_plain)} vs {row.own_reference}", na


def _split(split: dict[str, float] | None) -> str:
    if not split:
        return "–"
    return "/".join(f"{100 * split[p]:.0f}" for p in ("prefill", "draft", "verify", "other"))


def markdown(rows: Sequence[Row], sweeps: Sequence[SweepRow] = (), notes: Sequence[str] = ()) -> str:
    ref = next((r.reference for r in rows if r.reference), None)
    lines: list[str] = []
    header = ("| config | k | tok/s | speedup | cpu speedup | alpha | tau | E[tau] "
              "| time % pre/draft/verify/other | = plain | = hf-plain |")
    for workload in dict.fromkeys(r.workload for r in rows):
        mine = [r for r in rows if r.workload == workload]
        lines += [f"### {workload} ({mine[0].prompts} prompts)", "", header,
                  "|" + "---|" * header.count(" | ") + "---|"]
        for r in mine:
            eq_plain, eq_hf = _equality_cells(r)
            lines.append(
                f"| {r.config} | {r.k or '–'} | {r.tokens_per_s:.1f} | {_f(r.speedup, '.2f', 'x')} "
                f"| {_f(r.cpu_speedup, '.2f', 'x')} | {_f(r.alpha)} | {_f(r.tau)} "
                f"| {_f(r.expected_tau)} | {_split(r.time_split)} "
                f"| {eq_plain} | {eq_hf} |")
        lines.append("")
    if sweeps:
        ks = sorted({k for s in sweeps for k in s.ks})
        adaptive = any(s.adaptive is not None for s in sweeps)
        extra = " +auto | +auto / best |" if adaptive else ""
        head = ("| workload | proposer | metric | " + " | ".join(f"k={k}" for k in ks)
                + " | best k |" + extra)
        lines += ["### k sweep", "", head, "|" + "---|" * (len(ks) + 4 + 2 * adaptive)]
        for s in sweeps:
            metrics = [(m, v, f) for m, v, f in (("tok/s", s.tokens_per_s, ".1f"),
                                                 ("tau", s.tau, ".2f"),
                                                 ("speedup", s.speedup, ".2f"),
                                                 ("decode speedup", s.decode_speedup, ".2f"))
                       if v and not all(x is None for x in v)]
            for metric, values, fmt in metrics:
                by_k = dict(zip(s.ks, values))
                cells = " | ".join(_f(by_k.get(k), fmt) for k in ks)
                # The adaptive cells sit on the row of the metric they were scored by.
                scored = metric == s.scored_by
                tail = ""
                if adaptive:
                    tail = (f" {_f(s.adaptive, fmt)} | {_f(s.adaptive_vs_best, '.2f', 'x')} |"
                            if scored else " | |")
                lines.append(f"| {s.workload} | {s.name} | {metric} | {cells} | {s.best_k} |"
                             + tail)
        lines.append("")
    lines.append(f"tok/s: median over prompts. speedup: median per-prompt ratio over "
                 f"{ref or '(no reference run)'}; cpu speedup: the same per CPU second of the "
                 "process (all its threads), which leaves out time other tenants took the cores. "
                 "alpha = accepted/drafted; tau = tokens per "
                 "target forward; E[tau] = (1-alpha^(k+1))/(1-alpha). = plain: runs identical to "
                 "verispec's plain loop (none) / compared; a tie is a proven near-tie.")
    if any(s.scored_by == "decode speedup" for s in sweeps):
        lines.append("decode speedup: median per-prompt ratio of decoding rates (prefill "
                     "excluded; k cannot change it) over verispec's plain run; the k sweep "
                     "picks the best static k by it.")
    for ref in dict.fromkeys(r.own_reference for r in rows if r.own_reference):
        names = ", ".join(dict.fromkeys(r.config for r in rows if r.own_reference == ref))
        lines.append(f"{names}: llama.cpp's own kernels on the GGUF's blocks, with 8-bit "
                     f"activations rounded its way (verispec's quant-i8 path rounds its own, "
                     f"its quant and dense paths keep bf16), so they compute another function; = plain "
                     f"compares them only with "
                     f"{ref}, ties judged in its own logits.")
    lines += [f"note: {n}" for n in notes]
    return "\n".join(lines) + "\n"


def structured(records: Sequence[RunRecord]) -> str:
    """Runs under a prompt's grammar, per workload and config: how many outputs validate
    against their schema, the median time per request, the grammar engine's time per
    committed token, and the grammar-forced drafts per committed token. Empty without any."""
    runs = [r for r in records if r.grammar_seconds is not None]
    if not runs:
        return ""
    lines = ["### under the prompts' grammars", "",
             "| workload | config | schema-valid | invalid | cut | s/request | tau "
             "| grammar ms/token | grammar % of time | forced drafts/token |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for key in dict.fromkeys((r.workload, r.config) for r in runs):
        mine = [r for r in runs if (r.workload, r.config) == key]
        tokens = sum(r.tokens for r in mine) or 1
        forwards = sum(r.target_forwards or 0 for r in mine)
        grammar = sum(r.grammar_seconds or 0.0 for r in mine)
        total = sum(r.time_split.total for r in mine if r.time_split) or 1.0
        count = {s: sum(r.schema_valid == s for r in mine) for s in ("valid", "invalid", "cut")}
        lines.append(
            f"| {key[0]} | {key[1]} | {count['valid']}/{len(mine)} | {count['invalid']} "
            f"| {count['cut']} | {statistics.median(r.seconds for r in mine):.2f} "
            f"| {_f(tokens / forwards if forwards else None)} | {1000 * grammar / tokens:.3f} "
            f"| {100 * grammar / total:.1f} "
            f"| {sum(r.grammar_forced or 0 for r in mine) / tokens:.2f} |")
    lines += ["", "schema-valid: outputs that parse as JSON and validate against their prompt's "
              "schema (jsonschema); cut: ended by max_new_tokens first. grammar ms/token: time "
              "in the grammar engine (masks, draft checks, forced tokens, commits) per "
              "committed token.", ""]
    return "\n".join(lines)


def write_json(path: str | Path, records: Sequence[RunRecord], rows: Sequence[Row],
               sweeps: Sequence[SweepRow], environment: dict, settings: dict,
               notes: Sequence[str] = ()) -> Path:
    def record(r: RunRecord) -> dict:
        d = asdict(r)
        d["tokens_per_s"] = r.tokens_per_s
        d["decode_tokens_per_s"] = r.decode_tokens_per_s
        return d

    payload = {"environment": environment, "settings": settings, "notes": list(notes),
               "records": [record(r) for r in records],
               "summary": [asdict(r) for r in rows], "sweep": [asdict(s) for s in sweeps]}
    path = Path(path)
    path.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return path
