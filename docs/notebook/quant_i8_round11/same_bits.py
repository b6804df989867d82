"""same_bits.py MODEL POSITIONS VARIANT: logits of POSITIONS prompt rows (8-row chunks) with VS_WS=0
and with VS_WS=VARIANT on the round 11 throwaway; prints whether they are equal."""
import sys, os, torch
from verispec.models.loading import load_target
target = load_target(sys.argv[1], dtype="bf16", weights="quant-i8").target
torch.set_num_threads(1)
toks = torch.tensor(list(range(1000, 1000 + int(sys.argv[2]))))
outs = {}
with torch.inference_mode():
    for v in ("0", sys.argv[3]):  # VS_WS: 1 Q4_K, 2 Q6_K, 3 both
        os.environ["VS_WS"] = v
        cache = target.new_cache(400)
        outs[v] = target.forward(toks, cache, num_logits=len(toks)).logits.float()
print("equal:", torch.equal(outs["0"], outs[sys.argv[3]]), (outs["0"] - outs[sys.argv[3]]).abs().max().item())
