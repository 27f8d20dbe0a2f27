"""Reads a GGUF file: its metadata and its tensors, dequantised to float32 numpy arrays.

The header is parsed here (a flat loop over the key/value records: the token and
merge lists of a vocabulary are 100k strings, which the `gguf` package's reader turns
into per-string objects and parses several times slower). Dequantisation is the
`gguf` package's: its kernels are llama.cpp's reference implementations in numpy.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from local_backend.model.config import ModelLoadError

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
# Value types of the key/value records (gguf's GGUFValueType), with their struct formats.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
            12: "d"}
_STRING, _ARRAY = 8, 9
# What the engine dequantises: the float types, the legacy quants and the K-quants.
SUPPORTED_TYPES = frozenset(
    GGMLQuantizationType[name] for name in (
        "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    )
)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # row-major (torch order): GGUF's dimensions reversed
    kind: GGMLQuantizationType
    offset: int  # from the start of the file
    nbytes: int


class _Cursor:
    def __init__(self, data: memoryview, path: Path) -> None:
        self.data, self.pos, self.path = data, 0, path

    def unpack(self, fmt: str) -> Any:
        try:
            (value,) = struct.unpack_from("<" + fmt, self.data, self.pos)
        except struct.error as exc:
            raise ModelLoadError(f"{self.path}: truncated GGUF header") from exc
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        size = self.unpack("Q")
        raw = bytes(self.data[self.pos : self.pos + size])
        self.pos += size
        return raw.decode("utf-8", errors="replace")

    def value(self, kind: int) -> Any:
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.unpack("I"), self.unpack("Q")
            if item in _SCALARS:  # one read for the whole array (token types, scores)
                fmt = f"<{count}{_SCALARS[item]}"
                values = list(struct.unpack_from(fmt, self.data, self.pos))
                self.pos += struct.calcsize(fmt)
                return values
            return [self.value(item) for _ in range(count)]
        raise ModelLoadError(f"{self.path}: unknown GGUF value type {kind} at byte {self.pos}")


class GGUFFile:
    """Metadata (`metadata[key]`) and tensors (`tensors[name]`, `read(name)`) of one file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"{self.path}: cannot read ({exc})") from exc
        cursor = _Cursor(memoryview(self._map.data), self.path)
        if bytes(self._map[:4]) != MAGIC:
            raise ModelLoadError(f"{self.path}: not a GGUF file (no GGUF magic)")
        cursor.pos = 4
        version = cursor.unpack("I")
        if version not in (2, 3):
            raise ModelLoadError(f"{self.path}: GGUF version {version} is not supported "
                                 "(2 and 3 are; a big-endian file reads as a huge version)")
        tensor_count, kv_count = cursor.unpack("Q"), cursor.unpack("Q")
        self.metadata: dict[str, Any] = {}
        for _ in range(kv_count):
            key = cursor.string()
            self.metadata[key] = cursor.value(cursor.unpack("I"))
        infos = []
        for _ in range(tensor_count):
            name = cursor.string()
            dims = [cursor.unpack("Q") for _ in range(cursor.unpack("I"))]
            infos.append((name, tuple(reversed(dims)), cursor.unpack("I"), cursor.unpack("Q")))
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        start = -(-cursor.pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, shape, kind_id, offset in infos:
            try:
                kind = GGMLQuantizationType(kind_id)
            except ValueError:
                raise ModelLoadError(f"{self.path}: tensor {name!r} has unknown type id "
                                     f"{kind_id}") from None
            block, block_bytes = GGML_QUANT_SIZES[kind]
            count = int(np.prod(shape)) if shape else 1
            info = TensorInfo(name, shape, kind, start + offset, count // block * block_bytes)
            if info.offset + info.nbytes > len(self._map):
                raise ModelLoadError(f"{self.path}: tensor {name!r} runs past the end of the "
                                     "file (truncated download?)")
            self.tensors[name] = info

    def read(self, name: str) -> torch.Tensor:
        """The tensor as float32, in its row-major shape; refuses types it cannot dequantise."""
        info = self.tensors[name]
        if info.kind not in SUPPORTED_TYPES:
            raise ModelLoadError(
                f"{self.path}: tensor {name!r} is quantised as {info.kind.name}, which this "
                f"engine does not dequantise (supported: "
                f"{', '.join(sorted(t.name for t in SUPPORTED_TYPES))})"
            )
        raw = self._map[info.offset : info.offset + info.nbytes]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        values = np.asarray(dequantize(raw.reshape(rows, -1), info.kind), dtype=np.float32)
        if not values.flags.writeable:  # float types come back as views of the map
            values = values.copy()
        return torch.from_numpy(values.reshape(info.shape))
