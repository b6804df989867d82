#!/bin/bash
# Serving speed with glibc's adapted thresholds (/work/main, before the change) against the
# fixed ones (this tree): both servers up, load.py alternating between them, A B A B A B.
#   /work/bin/cpulock -x -- docs/notebook/soak_rss/speed_ab.sh [LABEL_A LABEL_B]
# (the labels name /work/main's server and this tree's in the output; round 1's were these).
# SPECULATION, JSON, goes to every request (e.g. '{"proposer": "ngram", "k": 4}': the same
# work for every request in every round, where `auto` learns from the outputs as it serves).
set -euo pipefail
here=$PWD label_a=${1:-adapted} label_b=${2:-fixed}
serve() { PYTHONPATH=$1 python3 -m verispec.cli serve --model default --port $2 \
    --max-num-seqs 8 --log-level warning > /dev/null 2>&1 & }
serve /work/main 8801; a=$!
serve "$here" 8802; b=$!
trap 'kill -INT $a $b; wait' EXIT
for port in 8801 8802; do
    until curl -sf http://127.0.0.1:$port/health > /dev/null; do sleep 2; done
done
for round in 1 2 3; do
    for port in 8801 8802; do
        echo -n "round $round $([ $port = 8801 ] && echo $label_a || echo $label_b): "
        PYTHONPATH=$here python3 scripts/load.py --url http://127.0.0.1:$port --concurrency 8 \
            --duration 40 --max-tokens 128 ${SPECULATION:+--speculation "$SPECULATION"}
    done
done
