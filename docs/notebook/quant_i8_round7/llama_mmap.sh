#!/bin/bash
B=/work/scratch/llama.cpp/build-0.3.36-native/bin/llama-bench
for r in 1 2 3 4 5; do
  for m in auto none; do
    ms=$($B -m $1 -p 0 -n 32 -d 200 -t 2 -r 1 -lm $m -o json 2>/dev/null | python3 -c "import json,sys; t=json.load(sys.stdin)[0]; print(f\"{t['samples_ns'][0]/1e6/32:.1f}\")")
    echo "round $r load=$m $ms ms/token"
  done
done
