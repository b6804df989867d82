"""`python -m verispec.bench.replay`'s table on stored greedy outputs, so that two checkouts
replay the very same (prompt, output) pairs: the first run generates them with the default
model (the module's own `_outputs`) and saves them to OUTPUTS; later runs, under any
checkout's PYTHONPATH, replay the stored ones through that checkout's `main`. A replay is a
function of (prompt, output, slope, k), so equal tables mean equal tokens per pass. (The
four-decimal table with summed passes quoted in docs/notebook/house_policy.md was printed
by this script's first version, at commit b94b136.)

    PYTHONPATH=BASE python docs/notebook/house_policy/replay_table.py /tmp/hp/outputs.json
    PYTHONPATH=.    python docs/notebook/house_policy/replay_table.py /tmp/hp/outputs.json

Ran at commits 3697828 and the policy branch (9ea1048-0827456), before issue 42's folder
move; kept as a record, not maintained: it may not run against today's modules.
"""
import json
import sys
from pathlib import Path

from verispec.bench import replay


def main() -> int:
    path = Path(sys.argv[1])
    generate = replay._outputs

    def stored(args) -> dict:
        if not path.exists():
            path.write_text(json.dumps(generate(args)))
        return json.loads(path.read_text())

    replay._outputs = stored
    return replay.main(["--workload", "all", "--limit", "6", "--max-new-tokens", "160",
                        *sys.argv[2:]])


if __name__ == "__main__":
    raise SystemExit(main())
