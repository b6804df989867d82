set -x
cd /work/wt-vnni256
export PYTHONPATH=$PWD OMP_NUM_THREADS=1
uptime
for round in 1 2; do
  verispec profile --weights quant-i8 --context 256 --max-n 8 --repeats 15 --out docs/results/quant_i8/avxvnni/profile_avx512_$round.json 2>&1 | tail -15
  VERISPEC_I8_ISA=avx-vnni verispec profile --weights quant-i8 --context 256 --max-n 8 --repeats 15 --out docs/results/quant_i8/avxvnni/profile_avxvnni_$round.json 2>&1 | tail -15
done
uptime
