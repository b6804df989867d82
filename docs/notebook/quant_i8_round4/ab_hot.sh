#!/bin/bash
# Round 4: the 32-weight kernels' compute at 1-10 rows, main's kernel (BASE, a detached
# worktree of the commit before) against a variant in /work/main, thread CPU time, 2 MiB of
# each layer's weights (the layers hot in L2/L3; the LM head still streams).
# usage: ab_hot.sh OUTDIR ROUNDS [WORKING_SET_BYTES]
out=$1; rounds=${2:-2}; ws=${3:-2097152}; mkdir -p $out
for i in $(seq 1 $rounds); do
  for side in base main; do
    dir=/work/$side; [ $side = base ] && dir=${BASE:-/work/wt-base}
    OMP_NUM_THREADS=1 python $dir/scripts/quant_kernel_speed.py --threads 1 --cpu-time --working-set $ws --models 135M --formats Q4_1-i8,Q8_0-i8 --rows 1,4,6,8,9,10 --repeats 5 > $out/$side.$i.md 2>&1
  done
done
for f in $out/*.md; do echo "== $f"; grep -h "all matmuls" $f | cut -d'|' -f4,7-; done
