"""Llama-family decoder (Llama 2/3, Mistral, Qwen2/3, SmolLM) with pluggable attention.

The module names mirror Hugging Face's `LlamaForCausalLM`, so a checkpoint's tensor
names load without renaming. The model knows nothing about KV caches: each layer
hands its projected q/k/v to an `Attention` callable, which the engine implements
over the paged cache and a plain loop implements over contiguous tensors.
"""

from __future__ import annotations

import math
import typing
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from local_backend.model.config import LlamaConfig

# Module tensors that pack several checkpoint tensors, concatenated along dim 0 in this order.
PACKED = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
}


def checkpoint_layout(config: LlamaConfig) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a Hugging Face checkpoint for `config` (lm_head if untied)."""
    c = config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    layout: dict[str, tuple[int, ...]] = {}
    layout["model.embed_tokens.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
            layout[p + f"self_attn.{name}.weight"] = (rows, c.hidden_size)
            if c.attention_bias:
                layout[p + f"self_attn.{name}.bias"] = (rows,)
        layout[p + "self_attn.o_proj.weight"] = (c.hidden_size, q)
        if c.o_proj_bias:
            layout[p + "self_attn.o_proj.bias"] = (c.hidden_size,)
        if c.qk_norm:
            layout[p + "self_attn.q_norm.weight"] = (c.head_dim,)
            layout[p + "self_attn.k_norm.weight"] = (c.head_dim,)
        layout[p + "mlp.gate_proj.weight"] = (c.intermediate_size, c.hidden_size)
        layout[p + "mlp.up_proj.weight"] = (c.intermediate_size, c.hidden_size)
        layout[p + "mlp.down_proj.weight"] = (c.hidden_size, c.intermediate_size)
        layout[p + "input_layernorm.weight"] = (c.hidden_size,)
        layout[p + "post_attention_layernorm.weight"] = (c.hidden_size,)
    layout["model.norm.weight"] = (c.hidden_size,)
    if not c.tie_word_embeddings:
        layout["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    return layout


def module_name(checkpoint_name: str) -> tuple[str, int]:
    """The module tensor a checkpoint tensor goes into, and its position in a packed tensor."""
    for packed, parts in PACKED.items():
        for index, part in enumerate(parts):
            if f".{part}." in checkpoint_name:
                return checkpoint_name.replace(part, packed), index
    return checkpoint_name, 0


class Attention(Protocol):
    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """q [tokens, heads, dim], k/v [tokens, kv_heads, dim] → [tokens, heads, dim]."""
        ...


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim/2], with `rope_scaling` (llama3, linear) applied."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths are slowed by `factor`, short ones kept, the band between blended.
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv_freq = torch.where(medium, blended, scaled)
    return inv_freq.float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x [tokens, heads, head_dim]; cos/signed_sin [tokens, 1, head_dim] (HF's rotate-half
    layout, the first half of signed_sin negated): x·cos + (−x₂, x₁)·sin, as
    x·cos + (x₂, x₁)·signed_sin in three ops (a decode step's cost is mostly per op)."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One call (torch sums in at least fp32 for bf16/fp16 inputs, as the reference does).
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hidden = config.hidden_size
        # q, k and v in one matmul (the checkpoint's three tensors are concatenated at load).
        out_features = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(hidden, out_features, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=config.o_proj_bias)
        # Qwen3: an RMSNorm over each head of q and of k, before the rotation.
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps) if config.qk_norm else None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, attn: Attention
    ) -> torch.Tensor:
        tokens = x.shape[0]
        qkv = self.qkv_proj(x).view(tokens, self.heads + 2 * self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            qk = torch.cat((self.q_norm(qkv[:, : self.heads]),
                            self.k_norm(qkv[:, self.heads : self.heads + self.kv_heads])), 1)
        else:
            qk = qkv[:, : self.heads + self.kv_heads]
        rotated = apply_rope(qk, cos, signed_sin)  # q and k at once
        q, k = rotated[:, : self.heads], rotated[:, self.heads :]
        # With low-precision weights (cpu_weights) qkv is bf16 and the rotation fp32.
        v = qkv[:, self.heads + self.kv_heads :].to(q.dtype)
        out = attn(self.layer, q, k, v)
        return self.o_proj(out.reshape(tokens, self.heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.size = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * self.size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        return self.down_proj(F.silu(gate_up[:, : self.size]) * gate_up[:, self.size :])


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, layer: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, attn: Attention
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, signed_sin, attn)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        # Built around an empty tensor: the weights always come from a checkpoint, and the
        # default random init on the meta device imports torch's reference ops (a second
        # of CPU at start-up).
        # nn.Embedding, or a table in a CPU weight format (model/cpu_weights.py).
        self.embed_tokens: nn.Module = nn.Embedding(
            config.vocab_size, config.hidden_size,
            _weight=torch.empty(config.vocab_size, config.hidden_size),
        )
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """`forward` maps a flat batch of tokens to final hidden states; `logits` projects rows."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        # nn.Linear, or an OutputHead over a CPU weight format's table.
        head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            head.weight = typing.cast(nn.Embedding, self.model.embed_tokens).weight
        self.lm_head: nn.Module = head
        self.kv_cache_dtype: torch.dtype | None = None  # None: the compute dtype
        self.weight_format: str | None = None  # a CPU weight format's name; None: compute dtype
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the activations and the KV cache (whatever the weights are stored in)."""
        return self.model.norm.weight.dtype

    @property
    def cache_dtype(self) -> torch.dtype:
        return self.kv_cache_dtype or self.compute_dtype

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, attn: Attention
    ) -> torch.Tensor:
        """input_ids, positions [tokens] (sequences concatenated) → hidden [tokens, hidden]."""
        x = self.model.embed_tokens(input_ids)
        inv_freq = typing.cast(torch.Tensor, self.inv_freq)  # [head_dim/2]
        freqs = positions.float()[:, None] * inv_freq[None, :]  # [tokens, head_dim/2]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # [tokens, 1, head_dim]
        half = emb.shape[-1] // 2
        sin = emb.sin()
        sin[..., :half].neg_()  # signed for apply_rope
        cos, sin = emb.cos().to(x.dtype), sin.to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, attn)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [rows, hidden] → logits [rows, vocab], at least fp32."""
        logits = self.lm_head(hidden)
        return logits.float() if logits.element_size() < 4 else logits
