"""Load a checkpoint into `LlamaForCausalLM`: HF safetensors here, GGUF via gguf_loader."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

import torch
from safetensors import safe_open

from local_backend.model.assemble import build_model
from local_backend.model.checkpoint_files import gguf_path, weight_files
from local_backend.model.config import LlamaConfig, ModelLoadError
from local_backend.model.cpu_weights import CpuWeights
from local_backend.model.llama import LlamaForCausalLM


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
    weights: CpuWeights | None = None,
    cache_dir: Path | None = None,
) -> LlamaForCausalLM:
    """A checkpoint directory (config.json + safetensors), or a GGUF file or a directory
    holding one (see `gguf_loader`). `weights`: see `cpu_weights`; `cache_dir`: where a
    GGUF's converted tensors are kept for the next start (`weight_cache`)."""
    directory = Path(directory)
    if gguf_path(directory) is not None:
        from local_backend.model.gguf_loader import load_gguf_model  # numpy/gguf only here

        return load_gguf_model(directory, device=device, dtype=dtype, progress=progress,
                               weights=weights, cache_dir=cache_dir)
    if not directory.is_dir():
        raise ModelLoadError(f"{directory}: model directory does not exist")
    config = LlamaConfig.from_file(directory / "config.json")
    return build_model(config, _safetensors(weight_files(directory)), source=str(directory),
                       device=device, dtype=dtype, progress=progress, weights=weights)
