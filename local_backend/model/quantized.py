"""Weight-only int8/int4 layers and a bf16 vocabulary table for CPU: fewer bytes per token.

A decode step reads every weight once, so on CPU its time follows the bytes of the
weights; these layers keep them in 8 or 4 bits and multiply in bf16 through torch's
weight-only kernels (`torch_compat`), which take bf16 inputs only and return bf16.
Each layer casts its input itself, so the residual stream around them stays fp32.

- int8: one scale per output row, levels −127..127 (symmetric).
- int4: a scale and a zero per group of 32 input features, levels 0..15 (asymmetric,
  the group's minimum and maximum at the two ends), then the scale and zero refitted
  to those levels by least squares in bf16. A GGUF Q4_1 tensor's groups of 32 are
  exactly such 16-level grids with both ends used, so its levels come back unchanged
  and only its scales and zeros are rounded (to bf16).
"""

from __future__ import annotations

import typing

import torch
import torch.nn.functional as F
from torch import nn

from local_backend import torch_compat
from local_backend.model.cpu_linear import PACK_BATCH_HINT

COMPUTE_DTYPE = torch.bfloat16  # the only input dtype the kernels vectorise
INT8_MAX = 127
INT4_LEVELS = 16
QUANTIZE_ROWS = 256  # rows quantised at a time
REFINED_LOGITS = 64  # per row: the largest logits, recomputed in fp32 (see OutputHead)


def _tensor(value: object) -> torch.Tensor:
    return typing.cast(torch.Tensor, value)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] → (levels int8 [out, in], scale bf16 [out]); w ≈ level · scale."""
    w = weight.detach().float()
    tiny = torch.finfo(COMPUTE_DTYPE).tiny
    # The scale is rounded to bf16 before the levels are chosen, so they absorb its error.
    scale = (w.abs().amax(1) / INT8_MAX).clamp(min=tiny).to(COMPUTE_DTYPE)
    levels = torch.round(w / scale.float()[:, None]).clamp(-INT8_MAX, INT8_MAX)
    return levels.to(torch.int8), scale


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] → (levels int32 0..15 [out, in], scale_zero bf16 [in/32, out, 2]),
    with w ≈ (level − 8) · scale + zero in each group of 32 input features."""
    out_features, in_features = weight.shape
    group = torch_compat.INT4_GROUP
    w = weight.detach().float().reshape(out_features, in_features // group, group)
    levels = torch.empty(out_features, in_features, dtype=torch.int32)
    scale_zero = torch.empty(out_features, in_features // group, 2)
    # In blocks of rows, so that the temporaries stay in cache (loading time).
    for start in range(0, out_features, QUANTIZE_ROWS):
        rows = slice(start, start + QUANTIZE_ROWS)
        low, high = torch.aminmax(w[rows], dim=-1)  # [rows, groups]
        tiny = torch.finfo(COMPUTE_DTYPE).tiny
        scale = ((high - low) / (INT4_LEVELS - 1)).clamp(min=tiny).to(COMPUTE_DTYPE).float()
        zero = (low + 8 * scale).to(COMPUTE_DTYPE).float()
        # Levels from the rounded scale and zero, so that they absorb the rounding:
        # (w − zero) / scale + 8.
        inverse = 1 / scale
        block = torch.addcmul((8 - zero * inverse)[..., None], w[rows], inverse[..., None])
        block = block.round_().clamp_(0, INT4_LEVELS - 1)  # [rows, groups, 32]
        levels[rows] = block.flatten(1)
        scale_zero[rows, :, 0], scale_zero[rows, :, 1] = _refit(w[rows], block - 8)
    return levels, scale_zero.transpose(0, 1).contiguous().to(COMPUTE_DTYPE)


def _refit(w: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 scale and zero [rows, groups] that best fit w ≈ t · scale + zero for fixed
    levels t (least squares, each rounded to bf16 in turn). Rounding a Q4_1 step to
    bf16 errs by up to 2⁻⁸ of it, the same way for the whole group; refitting the zero to
    the rounded scale takes the mean of that error out, so what is left averages out in
    a dot product instead of adding up."""
    t_mean, w_mean = t.mean(-1, keepdim=True), w.mean(-1, keepdim=True)
    spread = ((t - t_mean) ** 2).sum(-1)
    fitted = ((t - t_mean) * (w - w_mean)).sum(-1) / spread.clamp(min=1)
    tiny = torch.finfo(COMPUTE_DTYPE).tiny
    scale = torch.where(spread > 0, fitted, 0).clamp(min=tiny).to(COMPUTE_DTYPE).float()
    zero = (w - t * scale[..., None]).mean(-1).to(COMPUTE_DTYPE).float()
    return scale, zero


def dequantize_int4(levels: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """The weight [out, in] fp32 that `int4_mm` multiplies by (for tests and checks)."""
    group = torch_compat.INT4_GROUP
    scale = scale_zero[..., 0].float().T.repeat_interleave(group, dim=1)  # [out, in]
    zero = scale_zero[..., 1].float().T.repeat_interleave(group, dim=1)
    return (levels.float() - 8) * scale + zero


class Int8Linear(nn.Module):
    """y = x · (level · scale)ᵀ + bias; x [rows, in] any float dtype → [rows, out] bf16."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.out_features, self.in_features = linear.out_features, linear.in_features
        levels, scale = quantize_int8(linear.weight)
        self.register_buffer("levels", levels)  # [out, in] int8
        self.register_buffer("scale", scale)  # [out] bf16
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(COMPUTE_DTYPE), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(COMPUTE_DTYPE).contiguous()
        y = torch_compat.int8_mm(x, _tensor(self.levels), _tensor(self.scale))
        return y if self.bias is None else y + self.bias


class Int4Linear(nn.Module):
    """y = x · wᵀ + bias, w in groups of 32 (`quantize_int4`); x any float → bf16 out."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.out_features, self.in_features = linear.out_features, linear.in_features
        levels, scale_zero = quantize_int4(linear.weight)
        self.register_buffer("packed", torch_compat.int4_pack(levels))  # [out, in/2] uint8
        self.register_buffer("scale_zero", scale_zero)  # [in/32, out, 2] bf16
        bias = linear.bias
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(COMPUTE_DTYPE), False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(COMPUTE_DTYPE).contiguous()
        y = torch_compat.int4_mm(x, _tensor(self.packed), _tensor(self.scale_zero))
        return y if self.bias is None else y + self.bias


class Bf16Table(nn.Module):
    """A bf16 table: lookups in fp32, the projection by oneDNN's packed bf16 GEMM."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight.detach().to(COMPUTE_DTYPE))  # [vocab, hidden]
        # A plain attribute, not a buffer: the layout is oneDNN's own.
        self.packed = (torch_compat.mkldnn_pack(_tensor(self.weight), PACK_BATCH_HINT)
                       if torch_compat.has_bf16_linear() else None)
        # Without oneDNN's bf16 kernels (an AVX2-only CPU) a dense bf16 GEMM is far slower
        # than fp32: project through an fp32 copy there (twice the head's bytes).
        self.fp32 = None if self.packed is not None else _tensor(self.weight).float()

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        return _tensor(self.weight).index_select(0, ids).float()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [tokens] → embeddings [tokens, hidden] fp32."""
        return self.rows(ids)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        if self.fp32 is not None:
            return F.linear(x.float(), self.fp32)
        assert self.packed is not None
        x = x.to(COMPUTE_DTYPE).contiguous()
        return torch_compat.mkldnn_linear(x, self.packed, None)


class OutputHead(nn.Module):
    """The vocabulary projection through a low-precision table: hidden [rows, h] → fp32
    logits [rows, vocab].

    oneDNN's bf16 GEMM returns bf16, whose 8-bit significand rounds logits near 40 to steps
    of 0.25 and make near-ties in the greedy choice arbitrary. So the `REFINED_LOGITS`
    largest logits of each row are recomputed in fp32 from the same stored weights
    (the ones the greedy choice, the top logprobs and nucleus sampling look at); the
    rest keep bf16's 2⁻⁸ relative resolution.
    """

    def __init__(self, table: Bf16Table, refined: int = REFINED_LOGITS) -> None:
        super().__init__()
        self.table = table  # shared with the embedding when they are tied
        self.refined = refined

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.table.project(hidden).float()  # [rows, vocab]
        k = min(self.refined, logits.shape[-1])
        top = logits.topk(k, dim=-1, sorted=False).indices  # [rows, k]
        weights = self.table.rows(top.flatten()).view(*top.shape, -1)  # [rows, k, hidden]
        exact = torch.bmm(weights, hidden.float().unsqueeze(-1)).squeeze(-1)  # [rows, k]
        return logits.scatter_(-1, top, exact)
