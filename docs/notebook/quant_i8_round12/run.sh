# Issue 40 round 12, every figure in one go on a quiet machine (one thread each, in turn):
# the clock (round 10's port_tp.cpp), the 32-weight kernels hot (floor.py), the whole forward's
# T(1) and T(8) (loop.py) and perf's split of each (split.sh). Run from this folder:
#   bash run.sh 2>&1 | tee results.log
set -e
g++ -O2 -march=native -o /tmp/port_tp ../quant_i8_round10/port_tp.cpp
/tmp/port_tp | head -1
OMP_NUM_THREADS=1 python3 floor.py
for rows in 1 8 1 8; do OMP_NUM_THREADS=1 python3 loop.py $rows 10; done
OMP_NUM_THREADS=1 bash split.sh
/tmp/port_tp | head -1
