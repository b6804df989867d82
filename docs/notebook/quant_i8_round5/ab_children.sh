#!/bin/bash
# alternate children of two checkouts: A=$1 B=$2 file=$3 threads=$4 rounds=$5
for rep in $(seq 1 ${5:-5}); do
for wt in $1 $2; do
  out=$(python3 /work/$wt/scripts/quant_scale.py --child $3 --threads ${4:-1} --weights auto --context 200 --steps 32 --ns 1,8 --curve-repeats 3 | tail -1)
  echo "$wt $out"
done
done
