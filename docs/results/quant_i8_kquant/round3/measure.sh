#!/bin/bash
# Round 3 whole forward: main (before) vs the i8 branch (after), with llama-bench interleaved.
set -u
S=/work/scratch/synth
LB=/work/scratch/llama.cpp/build-0.3.36-native/bin/llama-bench
cd /work/scratch/i8r4
for pass in a b; do
  for t in 1 2; do
    for size in 0.5b 1.5b; do
      for tree in /work/main /work/wt/i8; do
        tag=$(basename $tree)
        echo "== $size t$t $tag $pass $(uptime)"
        OMP_NUM_THREADS=$t PYTHONPATH=$tree python3 -m verispec.cli.main profile --model $S/synth-$size-Q4_K_M.gguf --weights quant-i8 \
          --context 256 --max-n 16 --repeats 5 --out prof_${size}_t${t}_${tag}_$pass.json > prof_${size}_t${t}_${tag}_$pass.txt 2>&1
      done
      $LB -m $S/synth-$size-Q4_K_M.gguf -p 0 -n 64 -t $t -r 5 -o md > lb_${size}_t${t}_$pass.md 2>/dev/null
    done
  done
done
for tree in /work/main /work/wt/i8; do
  tag=$(basename $tree)
  echo "== 8b t1 $tag $(uptime)"
  OMP_NUM_THREADS=1 PYTHONPATH=$tree python3 -m verispec.cli.main profile --model $S/synth-8b-Q4_K_M.gguf --weights quant-i8 \
    --context 256 --max-n 8 --repeats 3 --out prof_8b_t1_$tag.json > prof_8b_t1_$tag.txt 2>&1
done
$LB -m $S/synth-8b-Q4_K_M.gguf -p 0 -n 32 -t 1 -r 3 -o md > lb_8b_t1.md 2>/dev/null
echo "== done $(uptime)"
