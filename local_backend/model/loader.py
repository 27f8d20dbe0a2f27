"""Load a Hugging Face checkpoint directory (config.json + safetensors) into `LlamaForCausalLM`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TextIO

import torch
from safetensors import safe_open

from local_backend.model.config import LlamaConfig, ModelLoadError
from local_backend.model.llama import LlamaForCausalLM, rope_inv_freq

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
    """A one-line text progress bar on stderr (no dependency, quiet when not a terminal)."""

    def __init__(self, total: int, stream: TextIO | None) -> None:
        self.total, self.done, self.stream = max(total, 1), 0, stream

    def advance(self, n: int = 1) -> None:
        self.done += n
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
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    expected = dict(model.state_dict())
    if config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    state: dict[str, torch.Tensor] = {}
    bar = _Progress(len(expected), progress)
    for path in files:
        with safe_open(str(path), framework="pt", device="cpu") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                if name not in expected:
                    if name.endswith("rotary_emb.inv_freq") or (
                        name == "lm_head.weight" and config.tie_word_embeddings
                    ):
                        continue
                    raise ModelLoadError(f"{path.name}: unexpected tensor {name!r}")
                tensor = handle.get_tensor(name)
                if tuple(tensor.shape) != tuple(expected[name].shape):
                    raise ModelLoadError(
                        f"{path.name}: tensor {name!r} has shape {tuple(tensor.shape)}, "
                        f"config.json implies {tuple(expected[name].shape)}"
                    )
                state[name] = tensor.to(device=device, dtype=dtype)
                bar.advance()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise ModelLoadError(f"{directory}: tensors missing from the checkpoint: {missing[:5]}")
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # Buffers are not in the checkpoint; rebuild them on the real device.
    model.register_buffer("inv_freq", rope_inv_freq(config).to(device), persistent=False)
    return model.eval()
