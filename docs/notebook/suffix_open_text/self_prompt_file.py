# Ran at commit 4e12389 (2026-12-03); kept as a record, not maintained: modules may have moved since.
"""A prompt file of N requests the default model writes itself (Magpie, as `train-head
--self-prompts` makes them: verispec/training/self_prompts.py), for `warm-suffix --prompts`.

    python docs/notebook/suffix_open_text/self_prompt_file.py 1500 self.jsonl
    verispec warm-suffix --prompts self.jsonl --suffix-cache store.npz --suffix-max-tokens 1000000
"""
import json
import sys
from pathlib import Path

from tqdm.auto import tqdm

from verispec import Engine
from verispec.training.self_prompts import SelfPromptSettings, self_prompts

count, out = int(sys.argv[1]), Path(sys.argv[2])
engine = Engine("default")
with tqdm(total=count, desc="self prompts", unit="prompt") as bar:
    made = self_prompts(engine.target, engine.tokenizer, SelfPromptSettings(count, seed=7),
                        out.with_suffix(".cache.jsonl"), progress=bar.update)
out.write_text("".join(json.dumps({"id": p.id, "messages": list(p.messages)}) + "\n"
                       for p in made))
print(f"{len(made)} requests in {out}")
