"""Load a Hugging Face checkpoint directory (config.json + safetensors) into `LlamaForCausalLM`."""

from __future__ import annotations

import json
import sys
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


class _Progress:
    """A one-line text progress bar (no dependency); silent without a stream."""

    def __init__(self, total: int, stream: TextIO | None) -> None:
        self.total, self.done, self.stream = max(total, 1), 0, stream

    def advance(self) -> None:
        self.done += 1
        if self.stream is None:
            return
        width = 30
        filled = width * self.done // self.total
        self.stream.write(
            f"\rloading weights [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
        )
        if self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def load_model(
    directory: Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: TextIO | None = sys.stderr,
) -> LlamaForCausalLM:
    directory = Path(directory)
    if not directory.is_dir():
        raise ModelLoadError(f"{directory}: model directory does not exist")
    config = LlamaConfig.from_file(directory / "config.json")
    files = weight_files(directory)
    layout = checkpoint_layout(config)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    # Packed module tensors (qkv, gate_up) fill up part by part, whatever the shard order.
    parts: dict[str, dict[int, torch.Tensor]] = {}
    state: dict[str, torch.Tensor] = {}
    seen: set[str] = set()
    bar = _Progress(len(layout), progress)
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name not in layout:
                    if name.endswith("rotary_emb.inv_freq") or name == "lm_head.weight":
                        continue  # a cached buffer, or a tied head written out anyway
                    raise ModelLoadError(f"{path.name}: unexpected tensor {name!r}")
                tensor = handle.get_tensor(name)
                if tuple(tensor.shape) != layout[name]:
                    raise ModelLoadError(
                        f"{path.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                        f"config.json implies {layout[name]}"
                    )
                seen.add(name)
                target, index = module_name(name)
                parts.setdefault(target, {})[index] = tensor.to(device=device, dtype=dtype)
                bar.advance()
    missing = sorted(set(layout) - seen)
    if missing:
        raise ModelLoadError(f"{directory}: tensors missing from the checkpoint: {missing[:5]}")
    for target, pieces in parts.items():
        ordered = [pieces[i] for i in sorted(pieces)]
        state[target] = ordered[0] if len(ordered) == 1 else torch.cat(ordered, dim=0)
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Buffers are not in the checkpoint; build them on the real device.
    model.register_buffer("inv_freq", rope_inv_freq(config).to(device), persistent=False)
    if torch.device(device).type == "cpu" and dtype == torch.float32:
        pack_linears(model)
    return model.eval()
