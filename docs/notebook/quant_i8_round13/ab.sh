# Issue 40 round 13: the whole forward's T(1) and T(8) (ratio.py) in processes alternating
# two checkouts, BEFORE and AFTER (source trees; each builds its own kernels), from this folder:
#   BEFORE=/work/main AFTER=/work/rest8 bash ab.sh ROUNDS SECONDS BLOCKS [MODEL]
for i in $(seq "$1"); do
  for tree in "$BEFORE" "$AFTER"; do
    echo -n "$tree "; OMP_NUM_THREADS=1 PYTHONPATH="$tree" python3 ratio.py "$2" "$3" $4 2>&1 | tail -1
  done
done
