# Issue 40 attention round 3: prof_ab.sh MODEL ROUNDS, verispec profile in processes alternating main (/work/main at aee7fe9) and the branch (/work/attn); output in profile_pairs_1.5b.txt
# prof_ab.sh MODEL ROUNDS: verispec profile T(n)/T(1), alternating main and attn builds
M=$1
for i in $(seq $2); do for v in old new; do if [ $v = new ]; then PP=/work/attn; else PP=/work/main; fi
PYTHONPATH=$PP OMP_NUM_THREADS=1 python3 -c "
import sys; sys.argv=['verispec','profile','--weights','quant-i8','--context','256','--max-n','8','--repeats','9','--out','/work/scratch/amx/p_$v.json'] + (['--model', '$M'] if '$M' != 'default' else [])
from verispec.cli.main import main; main()" > /dev/null 2>&1
python3 -c "
import json; d=json.load(open('/work/scratch/amx/p_$v.json')); print('$v', 'T1 %.2f ms' % d['t1_ms'], 'rel', [round(x, 3) for x in d['relative']])"; done; done
