"""Load a running verispec (or any OpenAI-compatible) server: streamed chat
requests at a fixed concurrency for a bounded time; prints throughput, latency
p50/p99, time to first token, errors and the server's tau.

    python scripts/load.py --url http://127.0.0.1:8000 --concurrency 8 --duration 30
    python scripts/load.py --url ... --concurrency 1,4,16 --speculation '{"proposer": "none"}'
"""
from __future__ import annotations

import argparse
import json
import sys

from verispec.serving.load import LoadConfig, format_row, run_load


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    p.add_argument("--concurrency", default="4", help="clients in parallel; a comma list runs each")
    p.add_argument("--duration", type=float, default=30.0, help="seconds to start requests")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--model", default=None, help="model name (default: the first listed)")
    p.add_argument("--workload", default="chat", help="bench workloads to draw prompts from")
    p.add_argument("--speculation", default=None,
                   help='JSON sent as each request\'s speculation, e.g. \'{"proposer": "ngram", "k": 4}\'')
    p.add_argument("--json", action="store_true", help="print one JSON object per concurrency")
    args = p.parse_args(argv)
    try:
        levels = [int(c) for c in args.concurrency.split(",")]
        speculation = json.loads(args.speculation) if args.speculation else None
    except ValueError as exc:
        print(f"load.py: error: {exc}", file=sys.stderr)
        return 2
    for level in levels:
        report = run_load(LoadConfig(args.url, level, args.duration, args.max_tokens,
                                     args.temperature, args.model, speculation,
                                     workload=args.workload))
        summary = report.summary()
        print(json.dumps(summary) if args.json else format_row(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
