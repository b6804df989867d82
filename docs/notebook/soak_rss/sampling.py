"""How much of a per-minute RSS spread is the sampling: per-minute means from every 2-s
probe sample, against means from every 5th sample (10 s, the soak's old rate; each of the
5 phases), over the probe's minutes FIRST..LAST.

    python docs/notebook/soak_rss/sampling.py /work/scratch/soak_rss/LABEL/probe.jsonl FIRST LAST
"""
import json
import sys

import numpy as np


def spread(values: list[float]) -> float:
    return 100 * (max(values) - min(values)) / min(values)


def main(path: str, first: int, last: int) -> None:
    with open(path, encoding="utf-8") as fh:
        lines = [json.loads(x) for x in fh]
    minutes = range(first - 1, last)

    def means(rows):
        return [np.mean([r["VmRSS"] / 1024 for r in rows if int(r["t"] // 60) == m])
                for m in minutes]

    print(f"every 2 s: {spread(means(lines)):.2f}%; every 10 s, by phase: "
          + ", ".join(f"{spread(means(lines[p::5])):.2f}%" for p in range(5)))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
