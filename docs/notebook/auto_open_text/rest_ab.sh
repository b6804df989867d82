#!/bin/bash
# Ran at commit 37dd433 (2026-12-04); kept as a record, not maintained: modules may have moved since.
# A/B (issue 20): HEAD (1342781) against the working tree (auto's costly candidates rest
# after a losing request), `auto` cold, interleaved rounds.
# Set up first: git worktree add /tmp/ab/base3 1342781
cd /tmp/ab
run() {  # $1 = label, $2 = round
  if [ "$1" = base ]; then env="PYTHONPATH=/tmp/ab/base3"; else env=""; fi
  echo "== $1 round $2" >> /tmp/ab/rest2.log
  env $env python3 -c "import sys; from verispec.cli import main; sys.exit(main())" bench --workload chat,creative --limit 12 --max-new-tokens 128 --k 8 --peers none --repeats 2 --weights quant-i8 --proposer none,auto --out /tmp/ab/rest2_$1_$2 --no-progress 2>&1 | grep "^| none\|^| auto\|^###" >> /tmp/ab/rest2.log
}
for r in $(seq 1 ${ROUNDS:-3}); do
  if [ $((r % 2)) = 1 ]; then run base $r; run new $r; else run new $r; run base $r; fi
done
echo done >> /tmp/ab/rest2.log
