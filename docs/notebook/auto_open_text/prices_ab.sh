#!/bin/bash
# Ran at commit dbd281a (2026-12-04); kept as a record, not maintained: modules may have moved since.
# A/B (issue 20): dcbb217 against the working tree (auto's prices carried between requests),
# `auto` cold, three interleaved rounds. Set up first: git worktree add /tmp/ab/base2 dcbb217
cd /tmp/ab
run() {  # $1 = label, $2 = round
  if [ "$1" = base ]; then env="PYTHONPATH=/tmp/ab/base2"; else env=""; fi
  echo "== $1 round $2" >> /tmp/ab/ab2.log
  env $env python3 -c "import sys; from verispec.cli import main; sys.exit(main())" bench --workload chat,creative --limit 12 --max-new-tokens 128 --k 8 --peers none --repeats 2 --weights quant-i8 --proposer none,auto --out /tmp/ab/auto_$1_$2 --no-progress 2>&1 | grep "^| none\|^| auto\|^###" >> /tmp/ab/ab2.log
}
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then run base $r; run new $r; else run new $r; run base $r; fi
done
echo done >> /tmp/ab/ab2.log
