"""Which files make up a checkpoint: safetensors (one file, or the shards an index
names), or one GGUF file. Only paths here: reading them is the loaders' job."""

from __future__ import annotations

import json
from pathlib import Path

from local_backend.model.config import ModelLoadError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint: one file, or the shards its index names."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        shards = sorted(set(weight_map.values()))
        missing = [name for name in shards if not (directory / name).is_file()]
        if missing:
            raise ModelLoadError(
                f"{directory}: shards named in {INDEX_FILE} are missing: {missing}"
            )
        return [directory / name for name in shards]
    if (directory / SINGLE_FILE).is_file():
        return [directory / SINGLE_FILE]
    if any(directory.glob("*.bin")) or any(directory.glob("*.pth")):
        raise ModelLoadError(
            f"{directory}: only safetensors checkpoints are supported (found .bin/.pth files)"
        )
    raise ModelLoadError(f"{directory}: neither {SINGLE_FILE} nor {INDEX_FILE} is present")


def gguf_path(path: Path) -> Path | None:
    """`path` if it is a .gguf file; the one .gguf file in a directory without config.json."""
    if path.suffix == ".gguf":
        return path
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        names = ", ".join(p.name for p in found)
        raise ModelLoadError(f"{path}: holds several .gguf files ({names}): name one")
    return found[0] if found else None
