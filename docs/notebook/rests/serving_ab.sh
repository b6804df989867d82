#!/bin/bash
# Ran at commit 143d13e (2026-12-04); kept as a record, not maintained: modules may have moved since.
# Serving A/B (issue 20): the parent commit against the working tree (rests), lookahead
# at 1, 4 and 16 streams, 2 rounds each, base then new then new then base.
# Set up first: git worktree add /tmp/ab/base5 <parent>
cd /tmp/ab
B="bench --concurrency 1,4,16 --k 4 --workload chat --duration 10 --rounds 2 --max-new-tokens 64 --control --peers none --no-progress"
serve() {  # $1 = label, $2 = PYTHONPATH or ""
  env ${2:+PYTHONPATH=$2} OMP_NUM_THREADS=1 python3 -c "import sys; from verispec.cli import main; sys.exit(main())" \
    $B --proposer lookahead --out /tmp/ab/rserve_$1 > /tmp/ab/rserve_$1.out 2>&1
  echo "== $1" >> /tmp/ab/rserve.log
  grep "^| " /tmp/ab/rserve_$1/report.md >> /tmp/ab/rserve.log 2>/dev/null
}
serve base_1 /tmp/ab/base5
serve new_1 ""
echo done >> /tmp/ab/rserve.log
