"""Assemble `LlamaForCausalLM` from named tensors, whatever file format they came from:
each tensor checked against the layout the configuration implies, packed parts joined,
buffers built on the target device."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TextIO

import torch

from local_backend.model.config import LlamaConfig, ModelLoadError
from local_backend.model.cpu_linear import pack_linears
from local_backend.model.cpu_weights import CpuWeights, convert_weights
from local_backend.model.llama import (
    LlamaForCausalLM,
    checkpoint_layout,
    module_name,
    rope_inv_freq,
)


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


def build_model(
    config: LlamaConfig,
    tensors: Iterable[tuple[str, str, torch.Tensor]],
    *,
    source: str,
    device: torch.device | str,
    dtype: torch.dtype,
    progress: TextIO | None,
    rope_factors: torch.Tensor | None = None,
    weights: CpuWeights | None = None,
) -> LlamaForCausalLM:
    """A model from (file, Hugging Face tensor name, tensor) triples, each checked against
    the layout `config` implies; `rope_factors` divide the rotary frequencies (Llama 3.1).
    `weights` (CPU only) stores the weights in bf16, int8 or int4 (`cpu_weights`) and
    computes in fp32 around them; `dtype` must then be fp32."""
    if weights is not None and (torch.device(device).type != "cpu" or dtype != torch.float32):
        raise ModelLoadError(f"{weights} weights are implemented for CPU, beside fp32 "
                             "activations, only")
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
    if weights is not None:
        convert_weights(model, weights)
    elif torch.device(device).type == "cpu" and dtype in (torch.float32, torch.bfloat16):
        pack_linears(model, dtype)
    return model.eval()
