"""Read a GGUF file as it is: its metadata, and each tensor's bytes as a
memory-mapped view, still in its quantized blocks.

The layout (github.com/ggml-org/ggml docs/gguf.md): magic "GGUF", version,
tensor count, metadata count, metadata key/value pairs, tensor infos (name,
dims innermost first, ggml type, offset), padding to `general.alignment`,
then the tensor data. `gguf.GGUFReader` parses this too, but it builds one
numpy view per array element, which takes seconds for a 49k-token
vocabulary; this reader walks the header with `struct` (string arrays are
only skipped, and decoded when asked for) and keeps the gguf package for what
it does well: the type table and the reference dequantization.

Every malformed input (short file, wrong magic, impossible counts, a tensor
that runs past the end) raises GGUFError, a ValueError with one line.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

_MAGIC = b"GGUF"
_MAX_COUNT = 1 << 24  # tensors or metadata keys; real files have a few thousand
_MAX_DIMS = 4
# GGUF value types -> struct code; 7 is bool, 8 string, 9 array.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
_STRUCTS = {code: struct.Struct("<" + code) for code in (*_SCALARS.values(), "I", "Q")}


class GGUFError(ValueError):
    """A file that is not a readable GGUF; the message is one line naming the file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    ggml_type: int  # gguf.GGMLQuantizationType value
    shape: tuple[int, ...]  # torch order, outermost first: (out_features, in_features)
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def type_name(self) -> str:
        import gguf

        return gguf.GGMLQuantizationType(self.ggml_type).name


@dataclass(frozen=True)
class StringArray:
    """A metadata array of strings, decoded only on demand (vocabularies are large)."""
    offset: int
    count: int


class GGUFFile:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            with self.path.open("rb") as fh:
                size = self.path.stat().st_size
                if size < 24:
                    raise GGUFError(f"{self.path.name} is not a GGUF file ({size} bytes)")
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise GGUFError(f"cannot read {self.path}: {exc.strerror}") from None
        self.size = size
        self._pos = 0
        self.metadata: dict[str, object] = {}
        self.tensors: dict[str, TensorInfo] = {}
        try:
            self._parse()
        except (struct.error, UnicodeDecodeError, OverflowError) as exc:
            raise GGUFError(f"{self.path.name}: corrupt or truncated GGUF header "
                            f"({type(exc).__name__} at byte {self._pos})") from None

    # -- header -------------------------------------------------------------
    def _take(self, fmt: str):
        packed = _STRUCTS[fmt]
        (value,) = packed.unpack_from(self._map, self._pos)
        self._pos += packed.size
        return value

    def _string(self) -> str:
        length = self._take("Q")
        self._need(length, "a string")
        text = bytes(self._map[self._pos:self._pos + length]).decode("utf-8")
        self._pos += length
        return text

    def _need(self, nbytes: int, what: str) -> None:
        if nbytes < 0 or self._pos + nbytes > self.size:
            raise GGUFError(f"{self.path.name}: corrupt or truncated GGUF header ({what} of "
                            f"{nbytes} bytes at byte {self._pos} runs past the end, "
                            f"{self.size} bytes)")

    def _value(self, kind: int, key: str):
        if kind in _SCALARS:
            return self._take(_SCALARS[kind])
        if kind == _STRING:
            return self._string()
        if kind != _ARRAY:
            raise GGUFError(f"{self.path.name}: corrupt GGUF metadata (value type {kind} for {key})")
        elem, count = self._take("I"), self._take("Q")
        if count > self.size:
            raise GGUFError(f"{self.path.name}: corrupt GGUF metadata ({key} claims {count} items)")
        if elem == _STRING:
            # Only skipped here (a vocabulary is ~100k strings); a length past the
            # end makes the next unpack fail, which reads as a truncated header.
            start = pos = self._pos
            unpack, buf = _STRUCTS["Q"].unpack_from, self._map
            for _ in range(count):
                pos += 8 + unpack(buf, pos)[0]
            self._pos = pos
            self._need(0, f"the items of {key}")
            return StringArray(start, count)
        if elem not in _SCALARS:
            raise GGUFError(f"{self.path.name}: corrupt GGUF metadata (array type {elem} for {key})")
        width = struct.calcsize(_SCALARS[elem])
        self._need(width * count, key)
        values = np.frombuffer(self._map, dtype=np.dtype("<" + _SCALARS[elem]), count=count,
                               offset=self._pos).copy()
        self._pos += width * count
        return values

    def _parse(self) -> None:
        import gguf

        magic = bytes(self._map[:4])
        if magic != _MAGIC:
            raise GGUFError(f"{self.path.name} is not a GGUF file (it starts with {magic!r}, "
                            f"not {_MAGIC!r})")
        self._pos = 4
        version = self._take("I")
        if version not in (2, 3):
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            hint = " (a big-endian file)" if swapped in (2, 3) else ""
            raise GGUFError(f"{self.path.name}: unsupported GGUF version {version}{hint}; "
                            f"verispec reads versions 2 and 3")
        tensor_count, kv_count = self._take("Q"), self._take("Q")
        if tensor_count > _MAX_COUNT or kv_count > _MAX_COUNT:
            raise GGUFError(f"{self.path.name}: corrupt GGUF header ({tensor_count} tensors, "
                            f"{kv_count} metadata keys)")
        for _ in range(kv_count):
            key = self._string()
            self.metadata[key] = self._value(self._take("I"), key)
        infos = []
        for _ in range(tensor_count):
            name = self._string()
            n_dims = self._take("I")
            if not 1 <= n_dims <= _MAX_DIMS:
                raise GGUFError(f"{self.path.name}: corrupt tensor info for {name} ({n_dims} dims)")
            dims = [self._take("Q") for _ in range(n_dims)]
            kind, offset = self._take("I"), self._take("Q")
            infos.append((name, dims, kind, offset))
        alignment = int(self.metadata.get("general.alignment", 32))
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFError(f"{self.path.name}: corrupt general.alignment {alignment}")
        data_start = -(-self._pos // alignment) * alignment
        for name, dims, kind, offset in infos:
            try:
                qtype = gguf.GGMLQuantizationType(kind)
            except ValueError:
                raise GGUFError(f"{self.path.name}: tensor {name} has unknown ggml type {kind}") from None
            block, type_size = gguf.GGML_QUANT_SIZES[qtype]
            if dims[0] % block:
                raise GGUFError(f"{self.path.name}: tensor {name} rows of {dims[0]} values are not "
                                f"whole {qtype.name} blocks of {block}")
            nbytes = dims[0] // block * type_size * int(np.prod(dims[1:], dtype=np.int64))
            start = data_start + offset
            if start + nbytes > self.size:
                raise GGUFError(f"{self.path.name} is truncated: tensor {name} needs bytes up to "
                                f"{start + nbytes}, the file has {self.size}")
            self.tensors[name] = TensorInfo(name, kind, tuple(reversed(dims)), start, nbytes)

    # -- access -------------------------------------------------------------
    def strings(self, key: str) -> list[str]:
        value = self.metadata[key]
        if not isinstance(value, StringArray):
            raise GGUFError(f"{self.path.name}: metadata {key} is not a string array")
        pos, out = value.offset, []
        for _ in range(value.count):
            (length,) = struct.unpack_from("<Q", self._map, pos)
            out.append(bytes(self._map[pos + 8:pos + 8 + length]).decode("utf-8", "replace"))
            pos += 8 + length
        return out

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes, [rows, bytes per row] uint8, a view of the mapped file."""
        info = self.tensors[name]
        rows = int(np.prod(info.shape[:-1], dtype=np.int64)) if len(info.shape) > 1 else 1
        flat = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        return flat.reshape(rows, info.nbytes // rows)

    def dequantize(self, name: str) -> np.ndarray:
        """float32 values in the tensor's shape: the gguf package's reference dequantization."""
        import gguf

        info = self.tensors[name]
        values = gguf.quants.dequantize(self.raw(name), gguf.GGMLQuantizationType(info.ggml_type))
        return np.array(values, dtype=np.float32).reshape(info.shape)  # a copy, writable

    def release(self, name: str) -> None:
        """Drop the tensor's mapped pages from this process's resident memory once it
        has been copied out (a pack): the file's bytes then count once, in the pack,
        not twice. The pages stay in the OS page cache, and any view re-reads them."""
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        info = self.tensors[name]
        start = info.offset // mmap.PAGESIZE * mmap.PAGESIZE
        self._map.madvise(mmap.MADV_DONTNEED, start, info.offset + info.nbytes - start)

    @property
    def file_bytes(self) -> int:
        return self.size

    def close(self) -> None:
        # Views handed out keep the map alive; closing only drops this object's reference.
        self._map = None
