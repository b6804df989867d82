import sys, os, torch
from verispec.models.loading import load_target
target = load_target(sys.argv[1], dtype="bf16", weights="quant-i8").target
torch.set_num_threads(1)
toks = torch.tensor(list(range(1000, 1300)))
outs = {}
with torch.inference_mode():
    for v in ("0", sys.argv[2]):
        os.environ["VS_FS"] = v
        cache = target.new_cache(400)
        outs[v] = target.forward(toks, cache, num_logits=300).logits.float()
print("equal:", torch.equal(outs["0"], outs[sys.argv[2]]), (outs["0"] - outs[sys.argv[2]]).abs().max().item())
