"""Every private torch operator the engine calls, in one place, checked against torch's version.

The CPU weight paths rest on operators with a leading underscore, which torch may
change or drop in any release: oneDNN's prepacked linear (`mkldnn._reorder_linear_weight`,
`mkldnn._linear_pointwise`) and the weight-only int8 and int4 matmuls
(`aten._weight_int8pack_mm`, `aten._convert_weight_to_int4pack_for_cpu`,
`aten._weight_int4pack_mm_for_cpu`). Their argument conventions, as used below, were
checked on the versions in `TESTED`; outside it each feature reports itself unavailable
and the callers keep dense weights or refuse the option with this module's reason.
"""

from __future__ import annotations

import re
from functools import cache

import torch

TESTED = ((2, 13), (2, 13))  # inclusive (major, minor) range these calls were checked on
INT4_GROUP = 32  # input features per int4 scale/zero pair


def torch_version() -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def version_supported() -> bool:
    return TESTED[0] <= torch_version() <= TESTED[1]


def why_unsupported() -> str:
    low, high = (".".join(map(str, v)) for v in TESTED)
    return (f"torch {torch.__version__} is outside the versions whose private CPU kernels "
            f"this engine was checked against ({low} to {high}; see local_backend/torch_compat.py)")


# ---- oneDNN prepacked linear (fp32, bf16) ----------------------------------------------

def has_mkldnn_linear() -> bool:
    ops = torch.ops.mkldnn
    return (version_supported() and torch.backends.mkldnn.is_available()
            and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise"))


@cache
def has_bf16_linear() -> bool:
    """oneDNN packs and runs bf16 weights: only on CPUs with AVX-512 (BW, VL, DQ) or
    AVX-NE-CONVERT; elsewhere (an AVX2-only CPU) `_reorder_linear_weight` raises for them."""
    return has_mkldnn_linear() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def mkldnn_pack(weight: torch.Tensor, batch_hint: int) -> torch.Tensor:
    """weight [out, in] fp32/bf16 → an opaque oneDNN layout tuned for `batch_hint` rows."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), batch_hint)


def mkldnn_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    """x [rows, in] contiguous, same dtype as the packed weight → [rows, out]."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


# ---- weight-only int8 (one scale per output row) ---------------------------------------

def has_int8_mm() -> bool:
    return version_supported() and hasattr(torch.ops.aten, "_weight_int8pack_mm")


def int8_mm_fits(in_features: int) -> bool:
    # The AVX-512 kernel reads the input in steps of 16: other widths give garbage or crash.
    return in_features % 16 == 0


def int8_mm(x: torch.Tensor, qweight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [rows, in] bf16, qweight [out, in] int8, scale [out] bf16 → x @ (q·scale)ᵀ [rows, out].

    Only bf16 inputs take the vectorised kernel; fp32 falls back to a scalar loop.
    """
    return torch.ops.aten._weight_int8pack_mm(x, qweight, scale)


# ---- weight-only int4 (asymmetric, a scale and a zero per group of input features) ------

def has_int4_mm() -> bool:
    aten = torch.ops.aten
    return (version_supported() and hasattr(aten, "_convert_weight_to_int4pack_for_cpu")
            and hasattr(aten, "_weight_int4pack_mm_for_cpu"))


def int4_mm_fits(out_features: int, in_features: int) -> bool:
    # The packing kernel works on tiles of 16 output rows; groups must tile the input.
    return out_features % 16 == 0 and in_features % INT4_GROUP == 0


def int4_pack(levels: torch.Tensor) -> torch.Tensor:
    """levels [out, in] integers 0..15 → the kernel's packed layout, uint8 [out, in / 2]."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(levels.to(torch.int32), 1)


def int4_mm(x: torch.Tensor, packed: torch.Tensor, scale_zero: torch.Tensor) -> torch.Tensor:
    """x [rows, in] bf16; packed from `int4_pack`; scale_zero [in / group, out, 2] bf16.

    Computes x @ wᵀ with w = (level − 8) · scale + zero, per group of `INT4_GROUP`
    input features. Like int8, only bf16 inputs are vectorised.
    """
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, INT4_GROUP, scale_zero)
