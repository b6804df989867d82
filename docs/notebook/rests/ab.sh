#!/bin/bash
# Ran at commit 143d13e (2026-12-04); kept as a record, not maintained: modules may have moved since.
# A/B: the parent commit against the working tree (a costly proposer under adaptive k
# rests after a request where its drafts lost time; host trims), interleaved rounds.
# Set up first: git worktree add /tmp/ab/base5 <parent>
# PROPOSERS, WORKLOADS: what to run; LOG: where the table rows go; TAG: names the reports.
cd /tmp/ab
LOG=${LOG:-/tmp/ab/rests.log}
PROPOSERS=${PROPOSERS:-none,lookahead+auto,auto}
WORKLOADS=${WORKLOADS:-chat,creative,summarize}
run() {  # $1 = label, $2 = round
  if [ "$1" = base ]; then env="PYTHONPATH=/tmp/ab/base5"; else env=""; fi
  echo "== $1 round $2" >> $LOG
  env $env OMP_NUM_THREADS=1 python3 -c "import sys; from verispec.cli import main; sys.exit(main())" \
    bench --workload $WORKLOADS --limit 6 --max-new-tokens 96 --k 8 --peers none \
    --repeats 2 --proposer $PROPOSERS --out /tmp/ab/rests_${TAG:-lookahead}_$1_$2 --no-progress \
    2>&1 | grep "^| none\|^| lookahead\|^| auto\|^| ngram\|^| eagle\|^###" >> $LOG
}
for r in $(seq 1 ${ROUNDS:-2}); do
  if [ $((r % 2)) = 1 ]; then run base $r; run new $r; else run new $r; run base $r; fi
done
echo done >> $LOG
