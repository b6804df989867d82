#!/bin/bash
# R7: the other checkout (here /work/wt/r7, the branch r7); /work/main is the baseline.
# ab_ckpt.sh MODEL THREADS ROWS ROUNDS: /work/main and $R7 alternating, step.py medians.
for r in $(seq $4); do
  a=$(cd /work/main && PYTHONPATH=/work/main python3 $(dirname $(realpath $0))/step.py $1 $2 200 $3 2>/dev/null)
  b=$(cd $R7 && PYTHONPATH=$R7 python3 $(dirname $(realpath $0))/step.py $1 $2 200 $3 2>/dev/null)
  echo "rows $3 round $r main $a r7 $b main/r7 $(python3 -c "print(f'{$a/$b:.3f}')")"
done
