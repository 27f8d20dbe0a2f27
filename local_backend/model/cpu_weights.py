"""What the CPU weight formats do to an assembled fp32 model: pack, cast or quantise.

- fp32: dense fp32, oneDNN-packed copies for decode batches (`cpu_linear`).
- bf16: the decoder's projections in bf16.
- int8: the decoder's projections in int8, one scale per output row.
- int4: the decoder's projections in int4, a scale and a zero per group of 32.

In all three the embedding table, which a tied model also uses as its output head,
is kept in bf16: its errors go straight into every logit, and oneDNN's bf16 GEMM
over it was as fast as the int8 kernel for one row and several times faster for a
batch (docs/benchmarks.md).

Only the weights change: the residual stream, the norms, attention and the logits
stay fp32 (each projection casts its input to bf16 and returns bf16), and the KV
cache is bf16. A layer whose shape a kernel cannot take keeps the next wider format
(int4 → int8 → bf16).
"""

from __future__ import annotations

from typing import Literal

from torch import nn

from local_backend import torch_compat
from local_backend.model.config import ModelLoadError
from local_backend.model.cpu_linear import PackedLinear
from local_backend.model.llama import LlamaDecoderLayer, LlamaForCausalLM
from local_backend.model.quantized import (
    COMPUTE_DTYPE,
    Bf16Table,
    Int4Linear,
    Int8Linear,
    OutputHead,
)

CpuWeights = Literal["bf16", "int8", "int4"]
CPU_WEIGHTS: tuple[CpuWeights, ...] = ("bf16", "int8", "int4")


def check_available(weights: CpuWeights) -> None:
    if not torch_compat.version_supported():
        raise ModelLoadError(f"{weights} weights: {torch_compat.why_unsupported()}")
    # bf16 is also where a layer goes that the int8/int4 kernels cannot take.
    if not torch_compat.has_bf16_linear():
        raise ModelLoadError(f"{weights} weights: this CPU has no bf16 matrix instructions "
                             "(oneDNN needs AVX-512 or AVX-NE-CONVERT); use --weights fp32")
    has = torch_compat.has_mkldnn_linear() and {
        "bf16": True, "int8": torch_compat.has_int8_mm(), "int4": torch_compat.has_int4_mm(),
    }[weights]
    if not has:
        raise ModelLoadError(f"{weights} weights: this torch build lacks the CPU kernel "
                             "(see local_backend/torch_compat.py)")


def _bf16(linear: nn.Linear) -> nn.Module:
    return PackedLinear(linear.to(COMPUTE_DTYPE))


def _int8(linear: nn.Linear) -> nn.Module:
    if torch_compat.int8_mm_fits(linear.in_features):
        return Int8Linear(linear)
    return _bf16(linear)


def _int4(linear: nn.Linear) -> nn.Module:
    if torch_compat.int4_mm_fits(linear.out_features, linear.in_features):
        return Int4Linear(linear)
    return _int8(linear)


SWAPS = {"bf16": _bf16, "int8": _int8, "int4": _int4}


def convert_weights(model: LlamaForCausalLM, weights: CpuWeights) -> LlamaForCausalLM:
    """Replace the fp32 projections, embedding and head of `model` in place."""
    check_available(weights)
    embed = model.model.embed_tokens
    head = model.lm_head
    assert isinstance(embed, nn.Embedding) and isinstance(head, nn.Linear)
    table = Bf16Table(embed.weight)
    model.model.embed_tokens = table
    tied = model.config.tie_word_embeddings
    model.lm_head = OutputHead(table if tied else Bf16Table(head.weight))
    swap = SWAPS[weights]
    for layer in model.model.layers:
        assert isinstance(layer, LlamaDecoderLayer)
        for parent in (layer.self_attn, layer.mlp):
            for name, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):
                    setattr(parent, name, swap(child))
    model.kv_cache_dtype = COMPUTE_DTYPE
    model.weight_format = weights
    return model
