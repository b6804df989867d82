"""Outputs of one checkout's integer kernels (both modules) for Q4_K/Q5_K/Q6_K packs and
n rows, saved for a bit-for-bit comparison against another checkout's:

    python cross_build_bits.py CHECKOUT OUT.pt
"""
import sys, torch, numpy as np
root = sys.argv[1]; sys.path.insert(0, root)
sys.path.insert(0, root + "/scripts")
import gguf
from verispec import kernels
from quant_kernel_speed import random_raw
rng = np.random.default_rng(0)
outs = {}
for name in ("Q4_K", "Q5_K", "Q6_K"):
    qtype = int(gguf.GGMLQuantizationType[name])
    raw = torch.from_numpy(random_raw(name, 192, 768, rng))
    packed = kernels.pack_quant_i8([(raw, qtype, 192)], 768)
    torch.manual_seed(1)
    for n in (1, 2, 3, 5, 8, 9, 16):
        x = torch.randn(n, 768).bfloat16()
        outs[f"{name}-{n}"] = kernels.linear(x, packed, 192).float()
        outs[f"v256-{name}-{n}"] = kernels.i8_backend("avx-vnni").linear(x, packed, 192, None).float()
torch.save(outs, sys.argv[2])
