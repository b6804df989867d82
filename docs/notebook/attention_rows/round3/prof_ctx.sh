# Issue 40 attention round 4: prof_ctx.sh MODEL CONTEXT ROUNDS (a worktree of aee7fe9 at /work/old against /work/main)
# prof_ctx.sh MODEL CONTEXT ROUNDS: verispec profile T(n)/T(1) at a context, alternating /work/old (aee7fe9) and /work/main
M=$1; C=$2
for i in $(seq $3); do for v in old main; do
PYTHONPATH=/work/$v OMP_NUM_THREADS=1 python3 -c "
import sys; sys.argv=['verispec','profile','--weights','quant-i8','--context','$C','--max-n','8','--repeats','7','--out','/work/scratch/r9/p_$v.json'] + (['--model', '$M'] if '$M' != 'default' else [])
from verispec.cli.main import main; main()" > /dev/null 2>&1
python3 -c "
import json; d=json.load(open('/work/scratch/r9/p_$v.json')); s=d['seconds']; print('$v', 'ctx $C T1 %.2f ms T8 %.2f ms' % (1e3*s[0], 1e3*s[7]), 'rel', [round(x, 3) for x in d['relative']])"; done; done
