"""A plain Llama forward pass with no cache, written from the equations, to check the engine."""

from __future__ import annotations

import torch

from local_backend.model.config import LlamaConfig


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [heads, tokens, dim]. Angles in fp32, as Hugging Face computes them."""
    dim = x.shape[-1]
    inv = (1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)).float()
    angles = positions.float()[:, None] * inv[None, :]
    cos = torch.cat((angles, angles), -1).cos().to(x.dtype)
    sin = torch.cat((angles, angles), -1).sin().to(x.dtype)
    x1, x2 = x[..., : dim // 2], x[..., dim // 2 :]
    return x * cos + torch.cat((-x2, x1), -1) * sin


def logits(state: dict[str, torch.Tensor], config: LlamaConfig, ids: list[int]) -> torch.Tensor:
    """Next-token logits [tokens, vocab] for every position of one sequence."""
    c = config
    n = len(ids)
    positions = torch.arange(n)
    x = state["model.embed_tokens.weight"][torch.tensor(ids)]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    group = c.num_attention_heads // c.num_key_value_heads
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        h = _rms(x, state[p + "input_layernorm.weight"], c.rms_norm_eps)

        def proj(name: str, heads: int, h: torch.Tensor = h, p: str = p) -> torch.Tensor:
            out = h @ state[p + f"self_attn.{name}.weight"].T
            if p + f"self_attn.{name}.bias" in state:
                out = out + state[p + f"self_attn.{name}.bias"]
            return out.view(n, heads, c.head_dim).transpose(0, 1)  # [heads, tokens, dim]

        q = _rope(proj("q_proj", c.num_attention_heads), positions, c.rope_theta)
        k = _rope(proj("k_proj", c.num_key_value_heads), positions, c.rope_theta)
        v = proj("v_proj", c.num_key_value_heads)
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = (q @ k.transpose(1, 2)) / c.head_dim**0.5
        scores = scores.masked_fill(~causal, float("-inf"))
        attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, -1)
        x = x + attn @ state[p + "self_attn.o_proj.weight"].T
        h = _rms(x, state[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
        gate = h @ state[p + "mlp.gate_proj.weight"].T
        up = h @ state[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ state[p + "mlp.down_proj.weight"].T
    x = _rms(x, state["model.norm.weight"], c.rms_norm_eps)
    head = state.get("lm_head.weight", state["model.embed_tokens.weight"])
    return x @ head.T


def greedy(
    state: dict[str, torch.Tensor], config: LlamaConfig, ids: list[int], n: int
) -> list[int]:
    """n greedy tokens, recomputing the whole sequence each time (no cache of any kind)."""
    tokens = list(ids)
    for _ in range(n):
        tokens.append(int(logits(state, config, tokens)[-1].argmax()))
    return tokens[len(ids) :]
