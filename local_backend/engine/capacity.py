"""How many sequences, tokens per step and KV blocks an engine gets on its device.

The KV cache takes what memory is left after the largest step the engine will run:
that step's forward (every token of `max_num_batched_tokens`, logits for
`max_num_seqs` rows) runs once before the cache is allocated, and its peak
allocation is what the cache leaves free (vLLM's profiling run). On CPU the forward
runs too, as a warm-up, and the cache is given a fixed byte budget.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from local_backend.model.llama import LlamaForCausalLM


@dataclass(frozen=True)
class DeviceDefaults:
    max_num_seqs: int
    max_num_batched_tokens: int  # per step: bounds how long a prefill chunk delays streams


GPU_DEFAULTS = DeviceDefaults(max_num_seqs=256, max_num_batched_tokens=8192)
CPU_DEFAULTS = DeviceDefaults(max_num_seqs=32, max_num_batched_tokens=256)
GPU_MEMORY_FRACTION = 0.9  # of the device's memory, for weights, activations and the cache
CPU_KV_BUDGET_BYTES = 256 << 20


def defaults_for(device: torch.device) -> DeviceDefaults:
    return GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS


def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int) -> int:
    c = model.config
    element = model.cache_dtype.itemsize
    return 2 * c.num_hidden_layers * block_size * c.num_key_value_heads * c.head_dim * element


def _causal_attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
                      ) -> torch.Tensor:
    """A cache-free stand-in with the real attention's activation sizes: [tokens, heads, dim]."""
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                         is_causal=True, enable_gqa=True)
    return out.transpose(0, 1)


@torch.inference_mode()
def largest_step(model: LlamaForCausalLM, defaults: DeviceDefaults) -> None:
    """One forward of `max_num_batched_tokens` tokens and logits for `max_num_seqs` rows."""
    device = model.model.norm.weight.device
    tokens = defaults.max_num_batched_tokens
    ids = torch.zeros(tokens, dtype=torch.long, device=device)
    positions = torch.arange(tokens, device=device) % model.config.max_position_embeddings
    hidden = model(ids, positions, _causal_attention)
    rows = torch.arange(min(defaults.max_num_seqs, tokens), device=device)
    model.logits(hidden.index_select(0, rows))


def kv_blocks(
    model: LlamaForCausalLM, block_size: int, defaults: DeviceDefaults,
    *, memory_fraction: float = GPU_MEMORY_FRACTION, cpu_budget_bytes: int = CPU_KV_BUDGET_BYTES,
) -> int:
    """KV blocks that fit once the largest step has run (which this call runs)."""
    device = model.model.norm.weight.device
    per_block = kv_bytes_per_block(model, block_size)
    if device.type != "cuda":
        largest_step(model, defaults)
        return max(1, cpu_budget_bytes // per_block)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    largest_step(model, defaults)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)  # weights + the step's activations
    _, total = torch.cuda.mem_get_info(device)
    return blocks_in(int(total * memory_fraction) - peak, per_block)


def blocks_in(free_bytes: int, per_block: int) -> int:
    """Whole blocks in `free_bytes`; 0 when nothing is left (the caller refuses to start)."""
    return max(0, free_bytes) // per_block
