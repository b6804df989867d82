#!/bin/bash
# Ran at commits 3697828 and the policy branch (9ea1048-0827456), before issue 42's folder move;
# kept as a record, not maintained.
# Issue 42's A/Bs, each under /work/bin/cpulock -x (one hold per call), through bench.py's
# switches. BASE: the checkout of 3697828 (git worktree add --detach $BASE 3697828); NEW: the
# policy branch. Reports land in $OUT/<name>/, the tables in $OUT/<name>.log.
#
#   ab.sh guard chat        serving guard on/off, ngram adaptive, 1/4/16 streams, on off off on
#   ab.sh rests             auto without the heads, rests on/off, one stream, on off off on
#   ab.sh auto WORKLOADS    none, ngram+auto, its A/A twin and auto, one stream, one process
#   ab.sh serve WORKLOADS   none, ngram adaptive, auto adaptive, none again, 1/4/16 streams
#   TREE=NEW TAG=new AUTO_TOKEN=auto+auto ab.sh auto ...: the same on the branch (its auto
#                           is adaptive only with +auto, like every other proposer)
#   ab.sh host              the policy's host work per step, replayed without a model
#   ab.sh main1 / mainN     main against the branch: one stream / 1, 4 and 16 streams
#                           (ORDER="base new new base"; N0 numbers the runs from N0 + 1)
HERE=${HERE:-$(cd "$(dirname "$0")" && pwd)}
BASE=${BASE:-/work/scratch/policy_base}
NEW=${NEW:-/work/wt/policy}
OUT=${OUT:-/tmp/hp}
mkdir -p "$OUT"
SERVING="--concurrency 1,4,16 --duration 10 --rounds 2 --max-new-tokens 64 --control --peers none --no-progress"
ONE="--max-new-tokens 128 --k 8 --peers none --repeats 2 --no-progress"

short() {  # a workload list as a short name: basenames without .jsonl
  echo "$1" | tr ',' '\n' | xargs -n1 basename | sed 's/\.jsonl$//' | paste -sd_
}

bench() {  # $1 = checkout, $2 = name, rest: bench arguments (env set by the caller)
  local tree=$1 name=$2
  shift 2
  (cd "$tree" && PYTHONPATH=$tree python3 "$HERE/bench.py" bench "$@" --out "$OUT/$name") \
    > "$OUT/$name.out" 2>&1
  { echo "== $name $(date -u +%H:%M)"; grep "^| \|^###" "$OUT/$name/report.md"; } >> "$OUT/$name.log"
}

case $1 in
  guard)
    for arm in on off off on; do
      n=$((n + 1))
      GUARD=$([ $arm = on ] && echo 1 || echo 0) SERVE_MODES=ngram OMP_NUM_THREADS=1 \
        bench "$BASE" "guard_$2_${arm}_$n" $SERVING --workload "$2" --proposer ngram
    done ;;
  rests)
    for arm in on off off on; do
      n=$((n + 1))
      AUTO_CANDIDATES=ngram,suffix,lookahead,draft AUTO_RESTS=$([ $arm = on ] && echo 1 || echo 0) \
        OMP_NUM_THREADS=1 bench "$BASE" "rests_${arm}_$n" --workload chat,creative,mixed \
        --limit 6 --max-new-tokens 96 --k 8 --peers none --repeats 2 --no-progress \
        --proposer none,auto,ngram+auto
    done ;;
  auto)
    bench "${TREE:-$BASE}" "auto_${TAG:-base}_$(short "$2")" $ONE \
      --workload "$2" --limit "${LIMIT:-8}" --proposer none,ngram+auto,ngram+auto+ngram_min=1,${AUTO_TOKEN:-auto} ;;
  serve)
    SERVE_MODES=ngram,auto OMP_NUM_THREADS=1 bench "${TREE:-$BASE}" \
      "serve_${TAG:-base}_$(short "$2")" $SERVING --workload "$2" --proposer ngram ;;
  main1)
    n=${N0:-0}
    for who in ${ORDER:-base new new base}; do
      n=$((n + 1))
      tree=$([ $who = base ] && echo "$BASE" || echo "$NEW")
      OMP_NUM_THREADS=1 bench "$tree" "main1_${who}_$n" --workload "${2:-summarize,code-edit,chat,mixed}" \
        --limit 5 --max-new-tokens 96 --k 8 --peers none --repeats 2 --no-progress \
        --proposer none,ngram+auto,ngram+auto+ngram_min=1,suffix+auto,ngram
    done ;;
  host)
    for who in base new new base; do
      tree=$([ $who = base ] && echo "$BASE" || echo "$NEW")
      (cd /tmp && OMP_NUM_THREADS=1 PYTHONPATH=$tree python3 "$HERE/policy_host.py") >> "$OUT/host.log" 2>&1
    done ;;
  mainN)
    n=${N0:-0}
    for who in ${ORDER:-base new new base}; do
      n=$((n + 1))
      tree=$([ $who = base ] && echo "$BASE" || echo "$NEW")
      OMP_NUM_THREADS=1 bench "$tree" "mainN_${who}_$n" $SERVING --workload "${2:-chat}" \
        --k 4 --proposer ngram
    done ;;
esac
echo "done $1 $2" >> "$OUT/done.log"
