"""Checkpoints in Hugging Face layout load and compute what the reference computes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from local_backend.model.config import LlamaConfig, ModelLoadError
from local_backend.model.llama import LlamaForCausalLM, rope_inv_freq
from local_backend.model.loader import load_model
from tests.local_backend import reference
from tests.local_backend.conftest import TINY, load_state, make_checkpoint

IDS = [256, 72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]


def causal(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """One sequence, no cache: plain causal attention ([tokens, heads, dim] in and out)."""
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True
    )
    return out.transpose(0, 1)


def model_logits(model: LlamaForCausalLM, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), causal)
        return model.logits(hidden)


def check_matches_reference(directory: Path, config: dict[str, Any]) -> None:
    model = load_model(directory, dtype=torch.float64, progress=None)
    expected = reference.logits(load_state(directory), LlamaConfig.from_dict(config), IDS)
    torch.testing.assert_close(model_logits(model, IDS).double(), expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("tied", [False, True])
def test_checkpoint_loads_and_matches_reference(tmp_path: Path, shards: int, tied: bool) -> None:
    config = {**TINY, "tie_word_embeddings": tied}
    directory = make_checkpoint(tmp_path, config, shards=shards)
    assert (directory / "model.safetensors.index.json").is_file() == (shards > 1)
    check_matches_reference(directory, config)


def test_qwen2_checkpoint_uses_qkv_bias(tmp_path: Path) -> None:
    config = {**TINY, "model_type": "qwen2", "tie_word_embeddings": True}
    directory = make_checkpoint(tmp_path, config)
    model = load_model(directory, progress=None)
    assert model.state_dict()["model.layers.0.self_attn.qkv_proj.bias"] is not None
    check_matches_reference(directory, config)


def test_missing_tensor_is_named(tmp_path: Path) -> None:
    directory = make_checkpoint(tmp_path, TINY, shards=2)
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    config = {**TINY, "num_hidden_layers": 3}  # the checkpoint only has two layers
    (directory / "config.json").write_text(json.dumps(config))
    assert index["weight_map"]
    with pytest.raises(ModelLoadError, match=r"model\.layers\.2\."):
        load_model(directory, progress=None)


def test_missing_config_is_named(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"config\.json"):
        load_model(tmp_path, progress=None)


def test_missing_weights_are_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    with pytest.raises(ModelLoadError, match=r"model\.safetensors"):
        load_model(tmp_path, progress=None)


def test_unsupported_architecture_is_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY, "model_type": "gpt2"}))
    with pytest.raises(ModelLoadError, match="gpt2"):
        load_model(tmp_path, progress=None)


def test_llama3_rope_scaling_matches_the_published_formula() -> None:
    raw = {**TINY, "hidden_size": 512, "num_attention_heads": 4, "rope_theta": 500000.0,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}
    config = LlamaConfig.from_dict(raw)
    base = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 128))
    expected = []
    for freq in base.tolist():  # Meta's reference implementation, one frequency at a time
        wavelen = 2 * math.pi / freq
        if wavelen < 8192 / 4.0:
            expected.append(freq)
        elif wavelen > 8192 / 1.0:
            expected.append(freq / 8.0)
        else:
            smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            expected.append((1 - smooth) * freq / 8.0 + smooth * freq)
    torch.testing.assert_close(rope_inv_freq(config), torch.tensor(expected).float())


def test_matches_transformers_llama_when_installed(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    directory = make_checkpoint(tmp_path, TINY)
    hf = transformers.LlamaForCausalLM.from_pretrained(directory, torch_dtype=torch.float64)
    with torch.inference_mode():
        expected = hf(torch.tensor([IDS])).logits[0]
    model = load_model(directory, dtype=torch.float64, progress=None)
    # transformers computes the rotary frequencies in fp32 arithmetic (ours: fp64, rounded to
    # fp32), one ulp apart; through the rotations that moves fp64 logits by up to ~2e-6.
    torch.testing.assert_close(model_logits(model, IDS).double(), expected, rtol=1e-5, atol=1e-5)
