#!/bin/bash
# Page faults per step: glibc's adapted thresholds (/work/main, before the change), the
# fixed ones (this tree), and the fixed ones with a top pad (MALLOC_TOP_PAD_ in bytes, $1).
# The three servers take load.py at concurrency 8 at the same time (nice 19, no lock); a
# count, not a timing. Prints minor faults and steps (/metrics) over the load.
set -euo pipefail
here=$PWD pad=${1:-16777216}
serve() { env $3 PYTHONPATH=$1 nice -n 19 python3 -m verispec.cli serve --model default \
    --port $2 --max-num-seqs 8 --log-level warning > /dev/null 2>&1 & }
serve /work/main 8811 X=1; a=$!
serve "$here" 8812 X=1; b=$!
serve "$here" 8813 MALLOC_TOP_PAD_=$pad; c=$!
trap 'kill -INT $a $b $c; wait' EXIT
for port in 8811 8812 8813; do
    until curl -sf http://127.0.0.1:$port/health > /dev/null; do sleep 2; done
done
faults() { awk '{print $10}' /proc/$1/stat; }
steps() { curl -s http://127.0.0.1:$1/metrics | awk '/^verispec_steps_total /{print $2}'; }
declare -A f0 s0
for p in "8811 $a" "8812 $b" "8813 $c"; do set -- $p; f0[$1]=$(faults $2); s0[$1]=$(steps $1); done
loads=()
for port in 8811 8812 8813; do
    PYTHONPATH=$here nice -n 19 python3 scripts/load.py --url http://127.0.0.1:$port \
        --concurrency 8 --duration 120 --max-tokens 128 > /dev/null &
    loads+=($!)
done
wait "${loads[@]}"
for p in "8811 $a adapted" "8812 $b fixed" "8813 $c fixed+pad"; do
    set -- $p
    df=$(( $(faults $2) - ${f0[$1]} )); ds=$(python3 -c "print(int(float('$(steps $1)') - float('${s0[$1]}')))")
    echo "$3: minor faults $df over $ds steps: $(( df / ds )) per step"
done
