#!/bin/bash
# Ran at commit 3f6bc34 (2026-12-04); kept as a record, not maintained: modules may have moved since.
# Serving A/B (issue 20): the allocator before (4cb7938, chain pricing) and after (tree
# shapes in Quote/Candidate), lookahead at 1, 4 and 16 streams, one round each, then
# `auto` with the change. Set up first: git worktree add /tmp/ab/mid 4cb7938
cd /tmp/ab
B="bench --concurrency 1,4,16 --k 4 --workload chat --duration 10 --rounds 1 --max-new-tokens 64 --control --peers none --no-progress"
serve() {  # $1 = label, $2 = PYTHONPATH or "", $3 = proposer
  # Each tree its own kernel cache: the build is keyed on the sources' paths.
  if [ -n "$2" ]; then cache=/tmp/vcache_mid; else cache=/tmp/vcache; fi
  env ${2:+PYTHONPATH=$2} VERISPEC_CACHE=$cache OMP_NUM_THREADS=1 python3 -c "import sys; from verispec.cli import main; sys.exit(main())" \
    $B --proposer $3 --out /tmp/ab/serve_$1 > /tmp/ab/serve_$1.out 2>&1
  grep "^| " /tmp/ab/serve_$1/report.md >> /tmp/ab/serve.log 2>/dev/null
  echo "== $1 done" >> /tmp/ab/serve.log
}
serve lookahead_before /tmp/ab/mid lookahead
serve lookahead_after "" lookahead
serve auto_after "" auto
echo done >> /tmp/ab/serve.log
