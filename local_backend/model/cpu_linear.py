"""fp32 and bf16 linear layers on CPU with oneDNN-prepacked weights.

PyTorch's default CPU GEMM (MKL) is slower than oneDNN with a weight reordered once
for it on decode-sized fp32 batches, while for one row or long prefill chunks MKL is
as fast or faster; so an fp32 layer keeps its dense weight and gains a packed copy,
used only for row counts in `FP32_PACKED_ROWS`. For bf16 the packed weight (oneDNN's
AVX-512 BF16 kernels) beat the dense bf16 matmul at every row count measured, so a
bf16 layer keeps only the packed copy where oneDNN can pack bf16 (AVX-512 or
AVX-NE-CONVERT), and only its dense weight elsewhere. Figures: docs/benchmarks.md.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from local_backend import torch_compat

FP32_PACKED_ROWS = (8, 128)  # inclusive bounds on x.shape[0] that use the packed fp32 weight
PACK_BATCH_HINT = 16  # rows oneDNN tunes the packed layout for


class PackedLinear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        self.dense = weight.dtype == torch.float32
        packable = self.dense or torch_compat.has_bf16_linear()
        # fp32 keeps the dense weight for the row counts MKL serves better; packed bf16
        # drops it.
        self.weight = linear.weight if self.dense or not packable else None
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.dtype = weight.dtype
        # A plain attribute, not a buffer: it must not appear in state_dict().
        self.packed = torch_compat.mkldnn_pack(weight, PACK_BATCH_HINT) if packable else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [rows, in], any float dtype → [rows, out] in the weight's dtype."""
        if self.packed is None or (self.weight is not None and not (
            FP32_PACKED_ROWS[0] <= x.shape[0] <= FP32_PACKED_ROWS[1] and x.dim() == 2
        )):
            assert self.weight is not None
            return F.linear(x.to(self.dtype), self.weight, self.bias)
        return torch_compat.mkldnn_linear(x.to(self.dtype).contiguous(), self.packed, self.bias)


def pack_linears(model: nn.Module, dtype: torch.dtype = torch.float32) -> int:
    """Swap every `nn.Linear` of `dtype` (fp32 or bf16) for a `PackedLinear`; returns how
    many were swapped.

    Does nothing (returns 0) where oneDNN is missing or the packed result disagrees
    with the dense one on a probe input.
    """
    if not torch_compat.has_mkldnn_linear():
        return 0
    swaps: list[tuple[nn.Module, str, nn.Linear]] = [
        (parent, name, child)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, nn.Linear) and child.weight.dtype == dtype
    ]
    if not swaps:
        return 0
    probe = swaps[0][2]
    tolerance = 1e-4 if dtype == torch.float32 else 2e-2
    try:
        with torch.inference_mode():
            x = torch.randn(FP32_PACKED_ROWS[0], probe.in_features, dtype=dtype)
            packed = PackedLinear(probe)(x).float()
            if not torch.allclose(packed, probe(x).float(), rtol=tolerance, atol=tolerance):
                return 0
    except RuntimeError:
        return 0
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    return len(swaps)
