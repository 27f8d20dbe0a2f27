"""The subset of a Hugging Face `config.json` that a Llama-family decoder needs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# model_type values whose checkpoints share the Llama layout (Qwen2 adds q/k/v bias,
# Qwen3 an RMSNorm over each head of q and k).
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class ModelLoadError(Exception):
    """A checkpoint is missing a file or uses something this engine does not support."""


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # q/k/v projections have a bias
    o_proj_bias: bool = False
    qk_norm: bool = False
    model_type: str = "llama"
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LlamaConfig:
        model_type = raw.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ModelLoadError(
                f"config.json: model_type {model_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                    "num_attention_heads"):
            if key not in raw:
                raise ModelLoadError(f"config.json: required field {key!r} is missing")
        heads = int(raw["num_attention_heads"])
        kv_heads = int(raw.get("num_key_value_heads") or heads)
        head_dim = int(raw.get("head_dim") or raw["hidden_size"] // heads)
        if heads % kv_heads:
            raise ModelLoadError(
                f"config.json: num_attention_heads {heads} is not a multiple of "
                f"num_key_value_heads {kv_heads}"
            )
        rope_theta, scaling = _rope(raw)
        _refuse_unimplemented(raw)
        # Qwen2 always has q/k/v bias; Llama and Qwen3 declare it (o_proj's too) with
        # `attention_bias`.
        qkv_bias = bool(raw.get("attention_bias", model_type == "qwen2"))
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=scaling,
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=qkv_bias,
            o_proj_bias=qkv_bias and model_type != "qwen2",
            qk_norm=model_type == "qwen3",
            model_type=model_type,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
        )

    @classmethod
    def from_file(cls, path: Path) -> LlamaConfig:
        if not path.is_file():
            raise ModelLoadError(f"{path}: config.json is missing")
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ModelLoadError(f"{path}: not valid JSON ({exc})") from exc
        return cls.from_dict(raw)


def _rope(raw: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """rope_theta and the scaling, from `rope_scaling` or (newer configs) `rope_parameters`."""
    parameters = raw.get("rope_parameters") or {}
    theta = float(raw.get("rope_theta", parameters.get("rope_theta", 10000.0)))
    scaling = raw.get("rope_scaling") or (parameters or None)
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in SUPPORTED_ROPE_TYPES:
            raise ModelLoadError(
                f"config.json: rope_scaling type {kind!r} is not implemented "
                f"(implemented: {', '.join(SUPPORTED_ROPE_TYPES)})"
            )
        if kind == "default":
            scaling = None
    return theta, scaling


def _refuse_unimplemented(raw: dict[str, Any]) -> None:
    """Settings that change what the model computes and that this engine does not do."""
    act = raw.get("hidden_act", raw.get("hidden_activation", "silu"))
    if act != "silu":
        raise ModelLoadError(f"config.json: hidden_act {act!r} is not implemented (only 'silu')")
    window = raw.get("sliding_window")
    # Qwen configs carry a window with `use_sliding_window: false`; Mistral's is in effect.
    if window is not None and raw.get("use_sliding_window", True):
        raise ModelLoadError(
            f"config.json: sliding_window {window} (attention over the last {window} tokens "
            "only) is not implemented"
        )
    if raw.get("mlp_bias"):
        raise ModelLoadError("config.json: mlp_bias (biases on the MLP projections) is not "
                             "implemented")
