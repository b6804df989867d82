# Ran at commit 4fb7f05 (2026-12-03); kept as a record, not maintained: modules may have moved since.
"""How far --weights quant-i8's logits are from the exact (bf16) path's on the default model,
over the 300 positions of tests/test_gguf_default.py: greedy agreement, the bf16 top-2 gap
where they disagree, logit differences and the next-token distributions' total variation.

    python docs/notebook/quant_i8/agreement.py
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests"))
from test_gguf_default import PROMPT, _logits_in_blocks  # noqa: E402

from verispec.models import loading  # noqa: E402

i8 = loading.load_target(None, weights="quant-i8")
exact = loading.load_target(None, weights="quant").target
ids = torch.tensor(i8.tokenizer.encode(PROMPT, add_special_tokens=False)[:300])
a = _logits_in_blocks(i8.target, ids).float()
b = _logits_in_blocks(exact, ids).float()
differ = a.argmax(-1) != b.argmax(-1)
top2 = b.topk(2, -1).values
print(f"greedy agreement {1 - differ.float().mean():.4f} ({int(differ.sum())} of 300 differ); "
      f"bf16 top-2 gaps there: {(top2[:, 0] - top2[:, 1])[differ].tolist()}")
print(f"|logit diff| max {(a - b).abs().max():.3f}, mean {(a - b).abs().mean():.4f}; "
      f"logit std {b.std():.2f}")
tv = 0.5 * (a.softmax(-1) - b.softmax(-1)).abs().sum(-1)
print(f"total variation mean {tv.mean():.4f}, max {tv.max():.4f}")
