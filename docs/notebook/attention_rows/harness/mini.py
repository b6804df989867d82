# Issue 40, ran at attn8 on main 749eff8 from a scratch folder holding main's attention.cpp as old.cpp and variants as <name>.cpp.
"""Build attention variants as tiny standalone modules: mini.load('old') -> module from old.cpp."""
import os
from pathlib import Path
from torch.utils.cpp_extension import load
HERE = Path(__file__).parent
FLAGS = ["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp"]

def build(name):
    d = HERE / "build" / name
    d.mkdir(parents=True, exist_ok=True)
    return load(name=f"attn_{name}", sources=[str(HERE / f"{name}.cpp"), str(HERE / "bind.cpp")],
                extra_cflags=FLAGS, extra_include_paths=[str(HERE)], extra_ldflags=["-fopenmp"],
                build_directory=str(d), verbose=False)
