#!/bin/bash
# Ran at commit dcbb217 (2026-12-04); kept as a record, not maintained: modules may have moved since.
# A/B (issue 20, host work per step): the parent commit against the working tree, chat, the warm
# integer-path store in /tmp/warm/i8store.npz, four interleaved rounds. Set up first:
#   git worktree add /tmp/ab/head ffdf2a7
#   VERISPEC_CACHE=/tmp/ab/cache PYTHONPATH=/tmp/ab/head python3 -c 'import verispec.kernels as k; k.isa()'
cd /tmp/ab
run() {  # $1 = label
  cp /tmp/warm/i8store.npz /tmp/ab/copy.npz
  if [ "$1" = head ]; then env="VERISPEC_CACHE=/tmp/ab/cache PYTHONPATH=/tmp/ab/head"; else env=""; fi
  echo "== $1 round $2" >> /tmp/ab/ab.log
  env $env python3 -c "import sys; from verispec.cli import main; sys.exit(main())" bench --workload chat --limit 12 --max-new-tokens 128 --k 8 --peers none --repeats 2 --weights quant-i8 --proposer none,suffix+auto --suffix-cache /tmp/ab/copy.npz --suffix-max-tokens 2000000 --out /tmp/ab/out_$1_$2 --no-progress 2>&1 | grep "^| none\|^| suffix" >> /tmp/ab/ab.log
}
for r in 1 2 3 4; do
  if [ $((r % 2)) = 1 ]; then run head $r; run new $r; else run new $r; run head $r; fi
done
echo done >> /tmp/ab/ab.log
