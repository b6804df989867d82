"""Check that attention.cpp's two scoring paths give every score the same bits.

Builds score_bits.cpp (which includes the checkout's verispec/kernels/attention.cpp)
and compares the raw float32 scores of block_scores and transposed_scores over
random queries and keys: head_dim 32-256, 1-300 keys, magnitudes 1e-3 to 100.
Output bits alone hide most such differences (a score's last bit rarely survives
the bf16 rounding of the output), so this is the sharp check of the claim.

  python3 docs/notebook/attention_rows/score_bits.py
"""
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parents[2] / "verispec" / "kernels"


def main():
    build = Path("/tmp") / "verispec_score_bits"
    build.mkdir(exist_ok=True)
    module = load(name="score_bits", sources=[str(HERE / "score_bits.cpp")],
                  extra_cflags=["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp"],
                  extra_include_paths=[str(KERNELS)], extra_ldflags=["-fopenmp"], build_directory=str(build))
    differing = total = 0
    for seed in range(60):
        gen = torch.Generator().manual_seed(seed)
        head_dim = (32, 64, 96, 128, 256)[seed % 5]
        keys = (1, 5, 16, 17, 100, 300)[seed % 6]
        scale = (1.0, 8.0, 1e-3, 100.0)[seed % 4]
        q = (torch.randn(7, head_dim, generator=gen) * scale).bfloat16()
        k = (torch.randn(keys, head_dim, generator=gen) * scale).bfloat16()
        by_key, shared = module.scores_both(q, k)
        total += by_key.numel()
        differing += (by_key.view(torch.int32) != shared.view(torch.int32)).sum().item()
    print(f"scores compared: {total}, with differing bits: {differing}")
    raise SystemExit(1 if differing else 0)


if __name__ == "__main__":
    main()
