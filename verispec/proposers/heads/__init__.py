"""Trained draft heads that read the target's own hidden states: EAGLE
(Li et al. 2024) and Medusa (Cai et al. 2024). format.py documents the
portable on-disk format; verispec.training makes heads; the `eagle` and
`medusa` proposers draft with them."""
from verispec.proposers.heads.format import (
                                             HeadConfig,
                                             check_target,
                                             find_shipped,
                                             read_head,
                                             save_head,
)
from verispec.proposers.heads.runtime import LoadedHead, bind, build_module, load_head

__all__ = ["HeadConfig", "LoadedHead", "bind", "build_module", "check_target", "find_shipped",
           "load_head", "read_head", "save_head"]
