#!/usr/bin/env bash
# Issue 18's before/after check: the same fixed `verispec bench` command (one stream) and
# the serving benchmark (1 and 16 streams) on two checkouts, interleaved round by round so
# that a noisy machine slows both alike. Results land in OUT/<round>-<name>-{bench,serve}/.
#
#   git worktree add /tmp/before d1869f4
#   scripts/before_after_bench.sh /tmp/before . OUT [ROUNDS]
#
# Compare medians across rounds; the spread between rounds of one checkout is the A/A band.
set -euo pipefail
before=$(cd "$1" && pwd)
after=$(cd "$2" && pwd)
out=$(mkdir -p "$3" && cd "$3" && pwd)
rounds=${4:-2}
bench=(bench --workload mixed --limit 3 --max-new-tokens 64 --proposer none,ngram+auto
       --peers none --no-progress)
serve=(bench --workload mixed --proposer ngram --k 4 --concurrency 1,16 --duration 5
       --max-new-tokens 64 --peers none --no-progress)
for round in $(seq 1 "$rounds"); do
  for side in before after; do
    dir=$([ "$side" = before ] && echo "$before" || echo "$after")
    (cd "$dir" && python -m verispec.cli "${bench[@]}" --out "$out/$round-$side-bench" \
      > "$out/$round-$side-bench.log" 2>&1)
  done
  for side in after before; do  # alternate which side goes first
    dir=$([ "$side" = before ] && echo "$before" || echo "$after")
    (cd "$dir" && python -m verispec.cli "${serve[@]}" --out "$out/$round-$side-serve" \
      > "$out/$round-$side-serve.log" 2>&1)
  done
done
echo "done: $out"
