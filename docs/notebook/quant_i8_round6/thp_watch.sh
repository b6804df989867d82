#!/bin/bash
# run decode_loop in background, sample its AnonHugePages each 2 s
python3 /work/scratch/r6/decode_loop.py "$@" > /work/scratch/r6/loop.out &
pid=$!
while kill -0 $pid 2>/dev/null; do
  a=$(grep -E "^AnonHugePages|^Rss" /proc/$pid/smaps_rollup 2>/dev/null | awk '{printf "%s %s  ", $1, $2}')
  echo "$(date +%T) $a $(grep AnonHugePages /proc/meminfo | awk '{print $2}')"
  sleep 2
done
cat /work/scratch/r6/loop.out
