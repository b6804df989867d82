"""Write Llama-shaped GGUF files with random weights at real model shapes, for
measuring costs at scale (ms per token, T(n)/T(1), memory) where no real model
of that size can be downloaded. Random weights make acceptance meaningless,
but every cost is the real one: the same shapes, the same block formats, the
same bytes per token.

Formats: the K-quants (Q4_K_M, Q5_K_M, Q6_K) through llama.cpp's own quantizer,
either the `llama-quantize` binary (--quantizer PATH, or the one
scripts/build_llama_cpp.sh built) or llama-cpp-python's binding (a Q8_0 file is
written first, then requantized); Q4_0 or Q8_0 written directly with the gguf
package. The tokenizer is the default model's
(SmolLM2's BPE), padded with unused tokens up to the shape's vocabulary, so
verispec and llama.cpp can both tokenize and run the file.

Examples:
  python scripts/synth_gguf.py --size 0.5b                  # /work/synth/synth-0.5b-Q4_K_M.gguf
  python scripts/synth_gguf.py --size all --format Q4_0 --out /data/synth
  python scripts/synth_gguf.py --size 8b --format Q8_0 --layers 4   # 8B widths, 4 layers
  python scripts/synth_gguf.py --size 1.5b --format Q6_K --quantizer ~/llama.cpp/build/bin/llama-quantize
  verispec generate --model /work/synth/synth-0.5b-Q4_K_M.gguf --prompt hi --proposer none
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's verispec

DEFAULT_OUT = Path("/work/synth")


@dataclass(frozen=True)
class Shape:
    arch: str  # GGUF architecture: qwen2 (q/k/v biases) or llama
    like: str  # the real model whose shapes these are
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    rope_theta: float

    def params(self, layers: int | None = None) -> int:
        n = layers or self.layers
        hd = self.hidden // self.heads
        attn = self.hidden * hd * (2 * self.heads + 2 * self.kv_heads)
        per_layer = attn + 3 * self.hidden * self.intermediate
        return n * per_layer + self.vocab * self.hidden * (1 if self.tied else 2)


SHAPES = {
    "0.5b": Shape("qwen2", "Qwen2.5-0.5B", 896, 4864, 24, 14, 2, 151936, True, 1e6),
    "1.5b": Shape("qwen2", "Qwen2.5-1.5B", 1536, 8960, 28, 12, 2, 151936, True, 1e6),
    "3b": Shape("llama", "Llama-3.2-3B", 3072, 8192, 28, 24, 8, 128256, True, 5e5),
    "8b": Shape("llama", "Llama-3.1-8B", 4096, 14336, 32, 32, 8, 128256, False, 5e5),
}
K_QUANTS = ("Q4_K_M", "Q5_K_M", "Q6_K")  # through llama.cpp's quantizer, from a Q8_0 file
FORMATS = (*K_QUANTS, "Q4_0", "Q8_0")


def _has_llama_cpp() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def find_quantizer(path: str | None) -> Path | None:
    """The llama-quantize binary: `path`, else the READY file of
    scripts/build_llama_cpp.sh or PATH (verispec.bench.llamaserver.find_tool)."""
    if path:
        return Path(path)
    from verispec.bench.llamaserver import find_tool

    return find_tool("llama-quantize")


def _tokenizer(writer, vocab: int) -> None:
    """The default model's BPE vocabulary, padded with unused tokens to `vocab`."""
    from verispec.models.gguf_file import GGUFFile
    from verispec.models.loading import default_gguf_path

    src = GGUFFile(default_gguf_path())
    tokens = src.strings("tokenizer.ggml.tokens")
    types = [int(t) for t in src.metadata["tokenizer.ggml.token_type"]]
    extra = vocab - len(tokens)
    tokens += [f"<|synth_{i}|>" for i in range(extra)]
    types += [5] * extra  # UNUSED
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(src.metadata.get("tokenizer.ggml.pre", "gpt2"))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(src.strings("tokenizer.ggml.merges"))
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("unknown", writer.add_unk_token_id), ("padding", writer.add_pad_token_id)):
        value = src.metadata.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None:
            add(int(value))
    writer.add_add_bos_token(False)
    writer.add_chat_template(src.metadata["tokenizer.chat_template"])


def _tensors(shape: Shape, layers: int):
    """(name, rows, cols, std) of every matrix and norm, in file order; cols 0 = a vector."""
    hd = shape.hidden // shape.heads
    h, inter = shape.hidden, shape.intermediate
    yield "token_embd.weight", shape.vocab, h, 0.02
    for i in range(layers):
        p = f"blk.{i}."
        yield p + "attn_norm.weight", h, 0, 0.0
        for n, rows in (("q", shape.heads * hd), ("k", shape.kv_heads * hd), ("v", shape.kv_heads * hd)):
            yield p + f"attn_{n}.weight", rows, h, h ** -0.5
            if shape.arch == "qwen2":
                yield p + f"attn_{n}.bias", rows, 0, 0.02
        yield p + "attn_output.weight", h, shape.heads * hd, h ** -0.5
        yield p + "ffn_norm.weight", h, 0, 0.0
        yield p + "ffn_gate.weight", inter, h, h ** -0.5
        yield p + "ffn_up.weight", inter, h, h ** -0.5
        yield p + "ffn_down.weight", h, inter, inter ** -0.5
    yield "output_norm.weight", h, 0, 0.0
    if not shape.tied:
        yield "output.weight", shape.vocab, h, h ** -0.5


def write_random(path: Path, shape: Shape, layers: int, fmt: str, seed: int) -> None:
    """Stream a random-weight GGUF to `path`, one tensor at a time (memory stays
    at about one tensor), matrices in `fmt` (Q4_0 or Q8_0), vectors in F32."""
    import gguf
    from tqdm import tqdm

    qtype = gguf.GGMLQuantizationType[fmt]
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), shape.arch)
    writer.add_name(f"synthetic {shape.like} shape, random weights")
    writer.add_block_count(layers)
    writer.add_context_length(8192)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_file_type(int({"Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
                              "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[fmt]))
    _tokenizer(writer, shape.vocab)
    specs = list(_tensors(shape, layers))
    for name, rows, cols, _ in specs:
        if cols:
            byte_shape = gguf.quant_shape_to_byte_shape((rows, cols), qtype)
            writer.add_tensor_info(name, byte_shape, np.dtype(np.uint8), int(np.prod(byte_shape)),
                                   raw_dtype=qtype)
        else:
            writer.add_tensor_info(name, (rows,), np.dtype(np.float32), rows * 4)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    total = sum(rows * max(cols, 1) for _, rows, cols, _ in specs)
    with tqdm(total=total, unit="param", unit_scale=True, desc=path.name, file=sys.stderr) as bar:
        for name, rows, cols, std in specs:
            if not cols:
                base = 1.0 if name.endswith("norm.weight") else 0.0  # norms near 1, biases near 0
                values = (base + std * rng.standard_normal(rows)).astype(np.float32)
                writer.write_tensor_data(values)
            else:
                # Quantize a slab of rows at a time: bounded memory for an 8B embedding.
                slab = max(1, (1 << 24) // cols)
                parts = []
                for start in range(0, rows, slab):
                    n = min(slab, rows - start)
                    values = rng.standard_normal((n, cols), dtype=np.float32) * np.float32(std)
                    parts.append(gguf.quants.quantize(values, qtype))
                    bar.update(n * cols)
                writer.write_tensor_data(np.concatenate(parts))
                continue
            bar.update(rows)
    writer.close()


def quantize_k(src: Path, dst: Path, fmt: str, threads: int, quantizer: Path | None) -> None:
    """llama.cpp's quantizer, Q8_0 -> `fmt`: the llama-quantize binary when given, else
    llama-cpp-python's binding of the same function (llama_model_quantize)."""
    if quantizer is not None:
        run = subprocess.run([str(quantizer), "--allow-requantize", str(src), str(dst), fmt,
                              str(threads)], capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"synth_gguf: {quantizer} failed (code {run.returncode}) on {src}:\n"
                             + run.stderr[-2000:])
        return
    import ctypes

    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{fmt}")
    params.nthread = threads
    params.allow_requantize = True
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"synth_gguf: llama.cpp's quantizer failed (code {rc}) on {src}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="synth_gguf.py", formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0],
        epilog="sizes: " + "; ".join(f"{k} = {s.like} ({s.arch}, hidden {s.hidden}, "
                                      f"{s.layers} layers, ~{s.params() / 1e9:.2f}B params)"
                                      for k, s in SHAPES.items())
               + "\n\n" + __doc__.split("\n\n", 3)[-1])
    parser.add_argument("--size", default="0.5b", choices=[*SHAPES, "all"],
                        help="which real model's shapes (default 0.5b); all = every size")
    parser.add_argument("--format", default=None, choices=FORMATS,
                        help="the K-quants need llama.cpp's quantizer (Q4_K_M is the default "
                             "when there is one), else Q4_0 (default without it) or Q8_0")
    parser.add_argument("--quantizer", default=None, metavar="PATH",
                        help="the llama-quantize binary for the K-quants (default: the one "
                             "scripts/build_llama_cpp.sh built, or PATH; else llama-cpp-python)")
    parser.add_argument("--layers", type=int, default=None,
                        help="fewer decoder layers than the real model (widths unchanged): "
                             "per-layer costs at a fraction of the disk and time")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output folder, outside git (default {DEFAULT_OUT})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="llama.cpp quantizer threads")
    parser.add_argument("--force", action="store_true", help="overwrite existing files")
    args = parser.parse_args(argv)
    quantizer = find_quantizer(args.quantizer)
    if quantizer is not None and not quantizer.is_file():
        parser.error(f"--quantizer {quantizer}: no such file")
    can_k = quantizer is not None or _has_llama_cpp()
    fmt = args.format or ("Q4_K_M" if can_k else "Q4_0")
    if fmt in K_QUANTS and not can_k:
        parser.error(f"--format {fmt} needs llama.cpp's quantizer: build llama-quantize with "
                     "scripts/build_llama_cpp.sh (or give --quantizer PATH), or pip install "
                     "llama-cpp-python; else use --format Q4_0 or Q8_0")
    if args.layers is not None and args.layers < 1:
        parser.error("--layers takes a positive number")
    args.out.mkdir(parents=True, exist_ok=True)
    for size in (SHAPES if args.size == "all" else [args.size]):
        shape = SHAPES[size]
        layers = min(args.layers or shape.layers, shape.layers)
        cut = f"-{layers}L" if layers < shape.layers else ""
        final = args.out / f"synth-{size}{cut}-{fmt}.gguf"
        if final.exists() and not args.force:
            print(f"synth_gguf: {final} exists (use --force to rewrite)", file=sys.stderr)
            continue
        start = time.perf_counter()
        first = final if fmt not in K_QUANTS else args.out / f".synth-{size}{cut}-Q8_0.tmp.gguf"
        print(f"synth_gguf: {shape.like} shape, {layers} layers, "
              f"{shape.params(layers) / 1e9:.2f}B params -> {final}", file=sys.stderr)
        write_random(first, shape, layers, "Q8_0" if fmt in K_QUANTS else fmt, args.seed)
        if fmt in K_QUANTS:
            try:
                quantize_k(first, final, fmt, args.threads, quantizer)
            finally:
                first.unlink(missing_ok=True)
        print(f"synth_gguf: wrote {final} ({final.stat().st_size / 2**20:.0f} MiB) in "
              f"{time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
