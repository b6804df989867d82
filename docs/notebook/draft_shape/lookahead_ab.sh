#!/bin/bash
# Ran at commit 4cb7938 (2026-12-04); kept as a record, not maintained: modules may have moved since.
# A/B: the parent commit against the working tree (adaptive k prices a tree step at the
# width it feeds, verispec/draft_shape.py), lookahead with adaptive k, interleaved rounds.
# Set up first: git worktree add /tmp/ab/base4 <parent>
# WEIGHTS: extra flags (e.g. "--weights quant-i8"); LOG: where the table rows go.
cd /tmp/ab
LOG=${LOG:-/tmp/ab/shape.log}
run() {  # $1 = label, $2 = round
  if [ "$1" = base ]; then env="PYTHONPATH=/tmp/ab/base4"; else env=""; fi
  echo "== $1 round $2" >> $LOG
  env $env OMP_NUM_THREADS=1 python3 -c "import sys; from verispec.cli import main; sys.exit(main())" \
    bench --workload chat,creative,summarize --limit 6 --max-new-tokens 96 --k 8 --peers none \
    --repeats 2 $WEIGHTS --proposer none,lookahead+auto,auto --out /tmp/ab/shape_$1_$2 --no-progress \
    2>&1 | grep "^| none\|^| lookahead\|^| auto\|^###" >> $LOG
}
for r in $(seq 1 ${ROUNDS:-2}); do
  if [ $((r % 2)) = 1 ]; then run base $r; run new $r; else run new $r; run base $r; fi
done
echo done >> $LOG
