"""PNG figures of a bench run, drawn with matplotlib's Agg backend (no display)."""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
import numpy as np  # noqa: E402

from verispec.bench.report import Row, SweepRow  # noqa: E402

_PARTS = ("prefill", "draft", "verify", "other")


def save_figure(fig, path: str | Path) -> Path:
    path = Path(path)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def speedup_vs_k(path: str | Path, sweeps: Sequence[SweepRow]) -> Path | None:
    """One panel per workload, one line per proposer; y is the metric the sweep
    scored k by (decode speedup, speedup or tokens/s: SweepRow.scored_by), with
    the adaptive run's score as a dashed line."""
    if not sweeps:
        return None
    workloads = list(dict.fromkeys(s.workload for s in sweeps))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4.2 * len(workloads), 3.4), squeeze=False)
    for ax, workload in zip(axes[0], workloads):
        for s in (s for s in sweeps if s.workload == workload):
            values = {"decode speedup": s.decode_speedup, "speedup": s.speedup,
                      "tok/s": s.tokens_per_s}[s.scored_by]
            line, = ax.plot(s.ks, values, marker="o", label=s.name)
            if s.adaptive is not None:
                ax.axhline(s.adaptive, color=line.get_color(), lw=1.2, ls="--",
                           label=f"{s.name}+auto (k chosen per step)")
            ax.set_ylabel(s.scored_by)
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_title(workload)
        ax.set_xlabel("k (draft tokens per target pass)")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def tau_vs_alpha(path: str | Path, rows: Sequence[Row]) -> Path | None:
    """Measured tau against alpha, one point per workload x config, over the
    i.i.d. curve E = (1 - alpha^(k+1)) / (1 - alpha) for each k used: points
    below their curve mean rejections cluster (early tokens fail more often)."""
    points = [r for r in rows if r.alpha is not None and r.tau is not None and r.k > 0]
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(5.6, 4.2))
    grid = np.linspace(0.0, 0.999, 200)
    ks = sorted({r.k for r in points})
    cmap = plt.get_cmap("viridis", max(2, len(ks)))
    for i, k in enumerate(ks):
        ax.plot(grid, (1 - grid ** (k + 1)) / (1 - grid), color=cmap(i), lw=1, label=f"E, k={k}")
    markers = dict(zip(dict.fromkeys(r.workload for r in points), "osD^v<>ph*"))
    for workload, marker in markers.items():
        ax.scatter([], [], marker=marker, color="white", edgecolor="black", label=workload)
    for r in points:
        ax.scatter(r.alpha, r.tau, color=cmap(ks.index(r.k)), marker=markers[r.workload],
                   edgecolor="black", zorder=3)
        # Labels stay readable only for a handful of points; a sweep has many.
        if len(points) <= 12:
            ax.annotate(r.name, (r.alpha, r.tau), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xlabel("alpha (accepted / drafted)")
    ax.set_ylabel("tau (tokens per target forward)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0.9, max(ks) + 1.1)
    ax.legend(fontsize=7, loc="upper left")
    return save_figure(fig, path)


def time_split(path: str | Path, rows: Sequence[Row]) -> Path | None:
    """Where verispec's time goes, as stacked fractions per workload x config."""
    bars = [r for r in rows if r.time_split]
    if not bars:
        return None
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * len(bars) + 2), 4.2))
    x = np.arange(len(bars))
    bottom = np.zeros(len(bars))
    for part in _PARTS:
        values = np.array([r.time_split[part] for r in bars])
        ax.bar(x, values, bottom=bottom, label=part)
        bottom += values
    ax.set_xticks(x, [f"{r.workload}\n{r.config}" for r in bars], rotation=60, ha="right",
                  fontsize=7)
    ax.set_ylabel("fraction of generate time")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8, ncols=4, loc="upper center", bbox_to_anchor=(0.5, 1.12))
    return save_figure(fig, path)


def k_trajectory(path: str | Path, records: Sequence) -> Path | None:
    """Draft length chosen per target pass, one panel per workload, for every
    configuration that chooses k or the proposer per step (adaptive, auto; a
    static k only shrinks at the end, near max_new_tokens): the first prompt of
    each workload, points coloured by the proposer that drafted."""
    chosen = [r for r in records if r.step_k and r.adaptive]
    if not chosen:
        return None
    workloads = sorted({r.workload for r in chosen})
    fig, axes = plt.subplots(len(workloads), 1, figsize=(8, 2.2 * len(workloads)), squeeze=False)
    colours: dict[str, str] = {}
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, workload in zip(axes[:, 0], workloads):
        first: dict[str, object] = {}
        for r in chosen:
            if r.workload == workload and r.config not in first:
                first[r.config] = r
        for offset, (label, r) in enumerate(first.items()):
            ax.plot(range(len(r.step_k)), [k + 0.08 * offset for k in r.step_k], lw=0.8,
                    color="0.7", zorder=1)
            for name in sorted(set(r.step_proposer)):
                colour = colours.setdefault(name, palette[len(colours) % len(palette)])
                steps = [i for i, p in enumerate(r.step_proposer) if p == name]
                ax.scatter(steps, [r.step_k[i] + 0.08 * offset for i in steps], s=6, color=colour,
                           label=f"{label}: {name}", zorder=2)
        ax.set_title(f"{workload} (first prompt)", fontsize=9)
        ax.set_ylabel("k chosen")
        ax.legend(fontsize=6, loc="upper right", ncols=2)
        keyed = next((r for r in first.values() if any(e is not None for e in r.step_evidence)),
                     None)
        if keyed is not None:
            # The evidence k was chosen from (n-gram lookup: matched suffix length).
            twin = ax.twinx()
            twin.step(range(len(keyed.step_evidence)),
                      [-1 if e is None else e for e in keyed.step_evidence], where="mid",
                      color="tab:orange", alpha=0.45, lw=1)
            twin.set_ylabel(f"{keyed.config}: evidence", fontsize=7, color="tab:orange")
            twin.set_ylim(-0.5, max(e or 0 for e in keyed.step_evidence) + 0.5)
    axes[-1, 0].set_xlabel("target pass")
    return save_figure(fig, path)


def draw_all(out_dir: str | Path, rows: Sequence[Row], sweeps: Sequence[SweepRow],
             records: Sequence = ()) -> list[Path]:
    out = Path(out_dir)
    made = [speedup_vs_k(out / "speedup_vs_k.png", sweeps),
            tau_vs_alpha(out / "tau_vs_alpha.png", rows),
            time_split(out / "time_split.png", rows),
            k_trajectory(out / "k_trajectory.png", records)]
    return [p for p in made if p is not None]
