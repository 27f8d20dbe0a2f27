"""Converted GGUF tensors kept on disk, so that a second start skips the conversion.

Reading a GGUF file dequantises every tensor in numpy, renames it and undoes
llama.cpp's row order for q and k: most of a small model's load time. The result
(the tensors under Hugging Face's names, as the engine assembles them) is written
once to a safetensors file under the cache directory and read from there, mapped
from the page cache, on every later start.

The file is named by the source's identity (its resolved path, size and modification
time) and `CONVERSION_VERSION`: a changed source, or a changed conversion, misses the
cache instead of loading stale weights. A damaged or unreadable entry is ignored
(and rewritten); a cache that cannot be written only costs the next start the
conversion again.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

log = logging.getLogger(__name__)

# Bump when what the conversion yields changes (names, row order, dequantisation).
CONVERSION_VERSION = 1
SUBDIRECTORY = "converted"

Tensors = Iterable[tuple[str, str, torch.Tensor]]  # (file, Hugging Face name, tensor)


def entry_path(cache_dir: Path, source: Path) -> Path:
    """Where the converted tensors of `source` are kept."""
    resolved = source.resolve()
    stat = resolved.stat()
    identity = f"{resolved}|{stat.st_size}|{stat.st_mtime_ns}|v{CONVERSION_VERSION}"
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return cache_dir / SUBDIRECTORY / f"{resolved.stem}-{digest}.safetensors"


def read_entry(path: Path) -> dict[str, torch.Tensor] | None:
    """The cached tensors by name, or None when there is no usable entry."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
    except (OSError, SafetensorError) as exc:
        log.warning("ignoring the converted-weights cache %s: %s", path, exc)
        return None


def cached(tensors: Tensors, cache_dir: Path | None, source: Path) -> Tensors:
    """`tensors` (a conversion of `source`), served from the cache when it holds them,
    else converted and written there for the next start."""
    if cache_dir is None:
        return tensors
    path = entry_path(cache_dir, source)
    found = read_entry(path)
    if found is not None:
        log.info("converted weights from the cache %s", path)
        return [(path.name, name, tensor) for name, tensor in found.items()]
    return _written(tensors, path)


def _written(tensors: Tensors, path: Path) -> Iterator[tuple[str, str, torch.Tensor]]:
    """Yields `tensors` as they come, and once all have come writes them to `path`."""
    kept: dict[str, torch.Tensor] = {}
    for file, name, tensor in tensors:
        kept[name] = tensor.contiguous()
        yield file, name, tensor
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file(kept, str(partial))
        os.replace(partial, path)  # a reader sees no entry or a whole one
    except OSError as exc:
        log.warning("cannot keep the converted weights in %s: %s", path.parent, exc)
        partial.unlink(missing_ok=True)
