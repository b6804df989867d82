"""The on-disk format of a trained head: one directory, two files.

    config.json        HeadConfig as JSON: the head type, the target it was
                       trained for (architecture, hidden size, vocab size,
                       layer count, weight fingerprints), the feature layers
                       it reads, its own shape, and how it was trained
    head.safetensors   the head's own parameters in bf16, plus `draft_vocab`
                       (int64 token ids) when it drafts from a reduced vocabulary

The target's embeddings, final norm and LM head are not stored: a head borrows
them from the loaded target (verispec.proposers.heads.target_parts). That is why a head
is only valid against the exact weights it was trained on, and why loading
checks `target.weights_fingerprint()` against the fingerprints recorded here
(one per dtype the target may be loaded in, since the fingerprint samples the
loaded tensors). Parameter names are those of `EagleHead` / `MedusaHead`'s
state_dict; `format_version` changes whenever a name or shape changes meaning.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from verispec.models.base import TargetModel
from verispec.proposers.heads.target_parts import TargetInfo

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "head.safetensors"
HEAD_TYPES = ("eagle", "medusa")
SHIPPED_DIR = Path(__file__).parent / "shipped"


@dataclass
class HeadConfig:
    type: str  # "eagle" or "medusa"
    target_architecture: str  # the target's config model_type
    target_name: str  # for messages only; the fingerprints decide compatibility
    target_fingerprints: list[str]  # accepted target.weights_fingerprint() values
    hidden_size: int
    vocab_size: int
    num_target_layers: int
    feature_layers: list[int]  # target hidden states read per position (HF index convention)
    # EAGLE's decoder layer; Medusa ignores these.
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate_size: int = 0
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    # Medusa: heads predicting positions +1..+num_medusa, each a stack of residual blocks.
    num_medusa: int = 0
    medusa_layers: int = 1
    draft_vocab_size: int = 0  # 0 drafts over the full vocabulary
    training: dict = field(default_factory=dict)  # how it was made: command, data, losses
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.type not in HEAD_TYPES:
            raise ValueError(f"unknown head type {self.type!r}; choose one of "
                             f"{', '.join(HEAD_TYPES)}")
        bad = [i for i in self.feature_layers if not 0 <= i <= self.num_target_layers]
        if not self.feature_layers or bad:
            raise ValueError(f"feature layers {self.feature_layers} must be non-empty and in "
                             f"[0, {self.num_target_layers}]")
        if self.type == "medusa" and self.num_medusa < 1:
            raise ValueError("a medusa head needs num_medusa >= 1")
        if self.type == "eagle" and self.num_heads * self.head_dim < 1:
            raise ValueError("an eagle head needs num_heads and head_dim")

    @property
    def fused(self) -> bool:
        """EAGLE-3-style input: several target layers concatenated, then projected."""
        return len(self.feature_layers) > 1

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @staticmethod
    def from_json(text: str, where: str = "config.json") -> "HeadConfig":
        raw = json.loads(text)
        version = raw.get("format_version")
        if version != FORMAT_VERSION:
            raise ValueError(f"{where}: head format version {version}, this verispec reads "
                             f"{FORMAT_VERSION}")
        known = {f.name for f in dataclasses.fields(HeadConfig)}
        return HeadConfig(**{k: v for k, v in raw.items() if k in known})


def new_config(kind: str, info: TargetInfo, fingerprints: list[str], target_name: str,
               feature_layers: list[int] | None = None, num_medusa: int = 4,
               medusa_layers: int = 1, draft_vocab_size: int = 0) -> HeadConfig:
    """A head shaped after its target: EAGLE's layer copies the target's attention
    geometry and MLP width (Li et al. 2024 use one target-shaped decoder layer)."""
    return HeadConfig(
        type=kind, target_architecture=info.architecture, target_name=target_name,
        target_fingerprints=sorted(set(fingerprints)), hidden_size=info.hidden_size,
        vocab_size=info.vocab_size, num_target_layers=info.num_layers,
        feature_layers=list(feature_layers or [info.num_layers]),
        num_heads=info.num_heads, num_kv_heads=info.num_kv_heads, head_dim=info.head_dim,
        intermediate_size=info.intermediate_size, rms_eps=info.rms_eps,
        rope_theta=info.rope_theta, num_medusa=num_medusa if kind == "medusa" else 0,
        medusa_layers=medusa_layers, draft_vocab_size=draft_vocab_size)


def check_target(config: HeadConfig, target: TargetModel, where: str = "head") -> None:
    """Raise a ValueError unless `target` has the weights the head was trained on."""
    found = target.weights_fingerprint()
    if found not in config.target_fingerprints:
        raise ValueError(
            f"{where} was trained for target {config.target_name!r} with weights hash "
            f"{' or '.join(config.target_fingerprints)}, but the loaded target {target.name!r} "
            f"has weights hash {found}; train a head for this model with `verispec train-head`")
    if (target.hidden_size, target.vocab_size) != (config.hidden_size, config.vocab_size):
        raise ValueError(f"{where} expects hidden size {config.hidden_size} and vocabulary "
                         f"{config.vocab_size}; {target.name} has {target.hidden_size} and "
                         f"{target.vocab_size}")


def save_head(folder: str | Path, config: HeadConfig, state: dict[str, torch.Tensor],
              draft_vocab: torch.Tensor | None = None) -> Path:
    """Write config.json and head.safetensors (floating tensors in bf16)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {name: t.detach().to("cpu", torch.bfloat16).contiguous()
               for name, t in state.items()}
    if draft_vocab is not None:
        tensors["draft_vocab"] = draft_vocab.detach().to("cpu", torch.int64).contiguous()
    tmp = folder / (WEIGHTS_FILE + ".tmp")
    save_file(tensors, str(tmp), metadata={"format": "verispec-head",
                                           "format_version": str(FORMAT_VERSION)})
    # safetensors writes owner-only files; a head is shared data like any model file.
    tmp.chmod(0o644)
    tmp.replace(folder / WEIGHTS_FILE)
    (folder / CONFIG_FILE).write_text(config.to_json() + "\n")
    return folder


@dataclass
class StoredHead:
    config: HeadConfig
    state: dict[str, torch.Tensor]  # the head's parameters as stored (bf16)
    draft_vocab: torch.Tensor | None  # [draft_vocab_size] int64, or None for the full vocabulary
    path: Path


def read_head(folder: str | Path) -> StoredHead:
    from safetensors.torch import load_file

    folder = Path(folder).expanduser()
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise ValueError(f"{folder} is not a head directory (needs {CONFIG_FILE} and "
                         f"{WEIGHTS_FILE}; make one with `verispec train-head`)")
    config = HeadConfig.from_json((folder / CONFIG_FILE).read_text(), str(folder / CONFIG_FILE))
    state = load_file(str(folder / WEIGHTS_FILE))
    draft_vocab = state.pop("draft_vocab", None)
    if draft_vocab is not None and draft_vocab.numel() != config.draft_vocab_size:
        raise ValueError(f"{folder}: draft_vocab has {draft_vocab.numel()} ids, config says "
                         f"{config.draft_vocab_size}")
    return StoredHead(config, state, draft_vocab, folder)


def shipped_heads() -> list[Path]:
    return sorted(p.parent for p in SHIPPED_DIR.glob(f"*/{CONFIG_FILE}"))


def find_shipped(kind: str, target: TargetModel) -> Path:
    """The shipped head of `kind` trained for `target`'s weights."""
    found = target.weights_fingerprint()
    for folder in shipped_heads():
        config = HeadConfig.from_json((folder / CONFIG_FILE).read_text(), str(folder))
        if config.type == kind and found in config.target_fingerprints:
            return folder
    raise ValueError(
        f"no shipped {kind} head matches {target.name} (weights hash {found}); train one with "
        f"`verispec train-head --type {kind} --target MODEL --out DIR` and pass --head DIR")
