#!/bin/bash
# Ran once at commit 4536af7 (the peer branch) on this machine's llama.cpp builds; kept as a
# record, not maintained.
# native vs avx512 build of the same llama.cpp: tg32 at depth 200, 1 and 2 threads, alternated
N=/work/scratch/llama.cpp/build-0.3.36-native/bin/llama-bench
A=/work/scratch/llama.cpp/avx512/build-0.3.36-avx512/bin/llama-bench
D=$(python3 -c "from verispec.models.loading import default_gguf_path; print(default_gguf_path())")
for round in 1 2 3; do
 for m in $D /work/scratch/synth/synth-1.5b-Q4_K_M.gguf; do
  for t in 1 2; do
   for b in $N $A; do
    ms=$($b -m $m -p 0 -n 32 -d 200 -t $t -r 1 -o json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin)[0]; print(d['samples_ns'][0]/1e6/32)")
    echo "round $round $(basename $m) t=$t $(basename $(dirname $(dirname $b))) $ms"
   done
  done
 done
done
