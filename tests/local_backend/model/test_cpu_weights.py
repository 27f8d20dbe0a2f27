"""The CPU weight formats: what each layer stores, what it computes, and what is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from torch import nn

from local_backend import torch_compat
from local_backend.model.config import ModelLoadError
from local_backend.model.cpu_linear import PackedLinear
from local_backend.model.gguf_loader import stored_weights
from local_backend.model.llama import LlamaForCausalLM
from local_backend.model.loader import load_model
from local_backend.model.quantized import (
    REFINED_LOGITS,
    Bf16Table,
    Int4Linear,
    Int8Linear,
    OutputHead,
    dequantize_int4,
    quantize_int4,
    quantize_int8,
)
from tests.local_backend.conftest import TINY, make_checkpoint
from tests.local_backend.gguf_writer import write_gguf
from tests.local_backend.model.test_loader import IDS, model_logits

BF16_EPS = 2.0**-8  # bf16's unit roundoff (8-bit significand, round to nearest)
needs_kernels = pytest.mark.skipif(
    not (torch_compat.has_int4_mm() and torch_compat.has_int8_mm()
         and torch_compat.has_mkldnn_linear() and torch_compat.has_bf16_linear()),
    reason="this torch or CPU lacks the CPU weight-only kernels (local_backend/torch_compat.py)")


def grid_weight(rows: int, cols: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight made as GGUF's Q4_1 makes one: per group of 32, levels 0..15 with both ends
    used, times a step, plus the group's minimum. Returns (weight, levels)."""
    g = torch.Generator().manual_seed(seed)
    levels = torch.randint(0, 16, (rows, cols // 32, 32), generator=g)
    levels[..., 0], levels[..., 1] = 0, 15
    step = torch.rand(rows, cols // 32, 1, generator=g) * 0.01 + 1e-3
    low = -torch.rand(rows, cols // 32, 1, generator=g) * 0.1
    return (levels * step + low).reshape(rows, cols), levels.reshape(rows, cols)


def test_int4_keeps_the_levels_of_a_q4_1_grid_and_rounds_only_scale_and_zero() -> None:
    weight, levels = grid_weight(64, 128)
    got_levels, scale_zero = quantize_int4(weight)
    assert torch.equal(got_levels, levels.to(torch.int32))
    assert scale_zero.shape == (128 // 32, 64, 2) and scale_zero.dtype == torch.bfloat16
    # (level − 8)·scale + zero: the scale is off by one bf16 roundoff, and the zero, rounded
    # after it, by one more, so a weight by 15·Δscale + Δzero at most
    scale = scale_zero[..., 0].float().T.repeat_interleave(32, dim=1)
    zero = scale_zero[..., 1].float().T.repeat_interleave(32, dim=1)
    bound = BF16_EPS * (15 * scale.abs() + zero.abs()) * (1 + 1e-5)
    assert ((dequantize_int4(got_levels, scale_zero) - weight).abs() <= bound).all()


def test_int8_rounds_each_weight_to_within_half_a_step_of_its_row() -> None:
    weight = torch.randn(48, 64, generator=torch.Generator().manual_seed(1))
    levels, scale = quantize_int8(weight)
    assert levels.dtype == torch.int8 and levels.abs().max() <= 127
    error = (levels.float() * scale.float()[:, None] - weight).abs()
    assert (error <= scale.float()[:, None] * 0.5 + 1e-7).all()


def reference_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What a bf16-input kernel must compute: bf16(x) · weight, summed in fp32."""
    return x.to(torch.bfloat16).float() @ weight.T


@needs_kernels
@pytest.mark.parametrize("rows", [1, 5, 16, 40])
def test_int4_and_int8_linears_multiply_by_their_stored_weights(rows: int) -> None:
    weight, _ = grid_weight(96, 128, seed=2)
    linear = nn.Linear(128, 96, bias=True)
    with torch.no_grad():
        linear.weight.copy_(weight)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(3))
    int4, int8 = Int4Linear(linear), Int8Linear(linear)
    levels, scale_zero = quantize_int4(weight)
    stored4 = dequantize_int4(levels, scale_zero)
    q8, s8 = quantize_int8(weight)
    stored8 = q8.float() * s8.float()[:, None]
    bias = linear.bias.detach().to(torch.bfloat16).float()
    with torch.inference_mode():
        for layer, stored in ((int4, stored4), (int8, stored8)):
            y = layer(x)
            assert y.dtype == torch.bfloat16 and y.shape == (rows, 96)
            expected = reference_product(x, stored) + bias
            # the kernel's fp32 sum is rounded to bf16 once, the bias added in bf16 once more
            bound = 3 * BF16_EPS * expected.abs() + 1e-3
            assert ((y.float() - expected).abs() <= bound).all()


@needs_kernels
@pytest.mark.parametrize("rows", [1, 16])
def test_the_output_head_returns_its_largest_logits_in_fp32(rows: int) -> None:
    g = torch.Generator().manual_seed(4)
    table = Bf16Table(torch.randn(1000, 64, generator=g))
    hidden = torch.randn(rows, 64, generator=g) * 3
    with torch.inference_mode():
        logits = OutputHead(table)(hidden)
    stored = table.rows(torch.arange(1000))  # the bf16 table, as fp32
    exact = hidden @ stored.T
    assert logits.dtype == torch.float32 and logits.shape == (rows, 1000)
    top = exact.topk(REFINED_LOGITS // 2, dim=-1).indices
    # the top of each row in fp32 (exact up to fp32 summation order) …
    torch.testing.assert_close(logits.gather(1, top), exact.gather(1, top), rtol=1e-5, atol=1e-5)
    assert torch.equal(logits.argmax(-1), exact.argmax(-1))
    # … and the rest within a bf16 GEMM's roundings: of each input (relative to the sum of
    # the terms' magnitudes) and of the result
    magnitude = hidden.abs() @ stored.abs().T
    assert ((logits - exact).abs() <= BF16_EPS * (magnitude + exact.abs())).all()


@needs_kernels
def test_each_layer_takes_the_narrowest_format_its_shape_allows(tmp_path: Path) -> None:
    # hidden 48 (3 heads of 16): q/k/v, o_proj and gate/up read 48 inputs, not a whole
    # number of int4 groups of 32 (→ int8); down_proj reads 128 and writes 48 rows, a
    # multiple of 16 (→ int4).
    config = {**TINY, "hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 1,
              "intermediate_size": 128, "tie_word_embeddings": True}
    directory = make_checkpoint(tmp_path, config)
    model = load_model(directory, progress=None, weights="int4")
    layer = model.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, Int8Linear)
    assert isinstance(layer.mlp.gate_up_proj, Int8Linear)
    assert isinstance(layer.self_attn.o_proj, Int8Linear)
    assert isinstance(layer.mlp.down_proj, Int4Linear)
    assert isinstance(model.lm_head, OutputHead)
    assert model.weight_format == "int4" and model.cache_dtype == torch.bfloat16
    bf16 = load_model(directory, progress=None, weights="bf16")
    assert isinstance(bf16.model.layers[0].mlp.down_proj, PackedLinear)
    # Each computes what it stores: against a float64 model given the same stored
    # weights, the logits move only by the bf16 rounding of the projections' inputs and
    # outputs, a few hundredths of their range.
    for converted in (model, bf16):
        expected = model_logits(stored_weights_model(directory, converted), IDS)
        got = model_logits(converted, IDS)
        assert got.dtype == torch.float32
        assert (got.double() - expected).abs().max() <= 0.05 * expected.abs().max()


def stored_weights_model(directory: Path, converted: nn.Module) -> LlamaForCausalLM:
    """The checkpoint in float64, each weight replaced by what `converted` stores for it."""
    model = load_model(directory, progress=None, dtype=torch.float64)
    for name, module in converted.named_modules():
        if isinstance(module, Int4Linear | Int8Linear | PackedLinear):
            target = model.get_submodule(name)
            weight = target.weight.detach().float()
            if isinstance(module, Int4Linear):
                stored = dequantize_int4(*quantize_int4(weight))
            elif isinstance(module, Int8Linear):
                levels, scale = quantize_int8(weight)
                stored = levels.float() * scale.float()[:, None]
            else:
                stored = weight.to(torch.bfloat16).float()
            target.weight.data = stored.double()
    table = model.model.embed_tokens.weight
    table.data = table.data.to(torch.bfloat16).double()  # tied: the output head as well
    return model


def test_cpu_weight_formats_are_refused_beside_other_dtypes_with_a_reason(
    tmp_path: Path,
) -> None:
    directory = make_checkpoint(tmp_path, TINY)
    with pytest.raises(ModelLoadError, match="int4 weights are implemented for CPU, beside "
                                             "fp32 activations, only"):
        load_model(directory, progress=None, dtype=torch.float64, weights="int4")


@pytest.mark.parametrize(("quant", "expected"), [
    (GGMLQuantizationType.Q4_1, "int4"),
    (GGMLQuantizationType.Q8_0, "int8"),
    (GGMLQuantizationType.F16, None),
    (GGMLQuantizationType.F32, None),
], ids=lambda v: getattr(v, "name", str(v)))
def test_a_gguf_suggests_the_narrowest_format_as_wide_as_its_matrices(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], quant: GGMLQuantizationType,
    expected: str | None,
) -> None:
    config = {**TINY, "vocab_size": 260, "tie_word_embeddings": True}
    state = {k: v for k, v in tiny_state.items() if k != "lm_head.weight"}
    write_gguf(tmp_path / "m.gguf", config, state, quant=quant)
    assert stored_weights(tmp_path / "m.gguf") == expected
