#!/bin/bash
# What the K-quant sub-block scale's VPMULLD costs: a second checkout (wt-exp6) where
# quant_i8_k.cpp's two `_mm512_mullo_epi32(part[r][j], sc)` are `_mm512_add_epi32` (wrong
# sums, the same loop otherwise), alternated with main, 3 rounds (vpmulld_whatif.log).
cd /work/main
ML=docs/notebook/quant_i8_round5/matmul_loop.py
for round in 1 2 3; do
  for fmt in Q4_K Q6_K; do for n in 1 8; do for wt in main wt-exp6; do
    echo "$round $wt $(python3 $ML /work/$wt $fmt $n 10000 | tail -1)"
  done; done; done
done
