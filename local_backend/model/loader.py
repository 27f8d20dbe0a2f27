"""Load a checkpoint into `LlamaForCausalLM`: HF safetensors here, GGUF via gguf_loader."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

import torch
from safetensors import safe_open

from local_backend.model.config import LlamaConfig, ModelLoadError
from local_backend.model.cpu_linear import pack_linears
from local_backend.model.llama import (
    LlamaForCausalLM,
    checkpoint_layout,
    module_name,
    rope_inv_freq,
)

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


class Progress:
    """A one-line text progress bar (no dependency), drawn once loading has taken a second."""

    SHOW_AFTER_S = 1.0

    def __init__(self, total: int, stream: TextIO | None, label: str = "loading weights") -> None:
        self.total, self.done, self.stream, self.label = max(total, 1), 0, stream, label
        self.started = time.monotonic()

    def advance(self) -> None:
        self.done += 1
        if self.stream is None or time.monotonic() - self.started < self.SHOW_AFTER_S:
            return
        width = 30
        filled = width * self.done // self.total
        if filled == width * (self.done - 1) // self.total and self.done < self.total:
            return  # redraw only when the bar grows
        self.stream.write(
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
        )
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def _safetensors(files: list[Path]) -> Iterator[tuple[str, str, torch.Tensor]]:
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name.endswith("rotary_emb.inv_freq"):
                    continue  # a cached buffer some checkpoints write out
                yield path.name, name, handle.get_tensor(name)


def load_model(
    directory: Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: TextIO | None = sys.stderr,
) -> LlamaForCausalLM:
    """A checkpoint directory (config.json + safetensors), or a GGUF file or a directory
    holding one (see `gguf_loader`)."""
    directory = Path(directory)
    if gguf_path(directory) is not None:
        from local_backend.model.gguf_loader import load_gguf_model  # numpy/gguf only here

        return load_gguf_model(directory, device=device, dtype=dtype, progress=progress)
    if not directory.is_dir():
        raise ModelLoadError(f"{directory}: model directory does not exist")
    config = LlamaConfig.from_file(directory / "config.json")
    return build_model(config, _safetensors(weight_files(directory)), source=str(directory),
                       device=device, dtype=dtype, progress=progress)


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


def build_model(
    config: LlamaConfig,
    tensors: Iterable[tuple[str, str, torch.Tensor]],
    *,
    source: str,
    device: torch.device | str,
    dtype: torch.dtype,
    progress: TextIO | None,
    rope_factors: torch.Tensor | None = None,
) -> LlamaForCausalLM:
    """A model from (file, Hugging Face tensor name, tensor) triples, each checked against
    the layout `config` implies; `rope_factors` divide the rotary frequencies (Llama 3.1)."""
    layout = checkpoint_layout(config)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # Packed module tensors (qkv, gate_up) fill up part by part, whatever the file order.
    parts: dict[str, dict[int, torch.Tensor]] = {}
    state: dict[str, torch.Tensor] = {}
    seen: set[str] = set()
    bar = Progress(len(layout), progress)
    for file, name, tensor in tensors:
        if name not in layout:
            if name == "lm_head.weight" and config.tie_word_embeddings:
                continue  # a tied head written out anyway
            raise ModelLoadError(f"{file}: unexpected tensor {name!r}")
        if tuple(tensor.shape) != layout[name]:
            raise ModelLoadError(
                f"{file}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                f"the model's configuration implies {layout[name]}"
            )
        seen.add(name)
        target, index = module_name(name)
        parts.setdefault(target, {})[index] = tensor.to(device=device, dtype=dtype)
        bar.advance()
    missing = sorted(set(layout) - seen)
    if missing:
        raise ModelLoadError(f"{source}: tensors missing from the checkpoint: {missing[:5]}")
    for target, pieces in parts.items():
        ordered = [pieces[i] for i in sorted(pieces)]
        state[target] = ordered[0] if len(ordered) == 1 else torch.cat(ordered, dim=0)
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Buffers are not in the checkpoint; build them on the real device.
    inv_freq = rope_inv_freq(config)
    if rope_factors is not None:
        inv_freq = inv_freq / rope_factors.float()
    model.register_buffer("inv_freq", inv_freq.to(device), persistent=False)
    if torch.device(device).type == "cpu" and dtype == torch.float32:
        pack_linears(model)
    return model.eval()
