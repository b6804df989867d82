"""Where verispec keeps what it builds or converts on this machine (converted
models, compiled kernels): one root, below every other module, so that both the
model loaders and the kernel build can reach it without importing each other."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$VERISPEC_CACHE, else $XDG_CACHE_HOME/verispec, else ~/.cache/verispec."""
    env = os.environ.get("VERISPEC_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "verispec"
