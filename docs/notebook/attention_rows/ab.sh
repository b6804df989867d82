#!/bin/sh
# (Issue 40, ran at attn8 on main 749eff8.) Alternate the timing of two checkouts' kernels, BEFORE then AFTER, ROUNDS times,
# under one exclusive CPU hold: ab.sh BEFORE_TREE AFTER_TREE OUT_DIR [ROUNDS]
set -e
here=$(dirname "$0")
mkdir -p "$3"
for i in $(seq 1 "${4:-2}"); do
  OMP_NUM_THREADS=1 PYTHONPATH="$1" python3 "$here/time_attend.py" --out "$3/before_$i.json" > /dev/null
  OMP_NUM_THREADS=1 PYTHONPATH="$2" python3 "$here/time_attend.py" --out "$3/after_$i.json" > /dev/null
done
for i in $(seq 1 "${4:-2}"); do
  echo "round $i"
  python3 "$here/time_attend.py" --compare "$3/before_$i.json" "$3/after_$i.json"
done
