"""Attention for a whole step in one FlexAttention call per layer, K/V read in place.

The step's tokens (decodes and prefill chunks together) are the queries of one
`flex_attention` call over the layer's whole cache seen as one long key sequence
([1, kv_heads, num_blocks * block_size, dim], a strided view: nothing is gathered or
padded). The block mask is built from the block tables: query block i (`Q_BLOCK`
consecutive tokens) visits only the cache blocks of the rows its tokens belong to, and
the mask function keeps, for a query of row r at position p, the keys of r's own blocks
at logical positions ≤ p. Every user of a physical block holds it at the same logical
index (prefix sharing shares leading blocks only), so one `logical[block]` array serves
all rows.

Eagerly, torch computes flex attention densely over every key of the cache (its
reference implementation); only a compiled `flex_attention` skips the blocks the mask
leaves out. The gather + SDPA path (attention/paged.py) stays the reference, and the
default wherever this one has not been measured faster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from local_backend.engine.step_inputs import StepTensors

Q_BLOCK = 16  # query tokens per block of the mask (the CUDA kernels' smallest tile)

FlexFn = Callable[..., Any]


def build_block_mask(step: StepTensors, num_blocks: int, block_size: int) -> BlockMask:
    """The step's mask: query token t (row r, position p) sees key slot s iff block
    s // block_size is r's block number s // block_size logically and its position ≤ p."""
    device = step.input_ids.device
    rows, tokens = step.num_rows, step.num_tokens
    starts, context = step.starts_host, step.context_host
    lengths = np.diff(starts)
    owner = np.repeat(np.arange(rows), lengths)  # [tokens] row of each query token
    table, table_host = step.block_tables, step.tables_host  # [rows, width]
    used = [-(-int(c) // block_size) for c in context]  # blocks each row really uses
    logical = np.zeros(num_blocks, dtype=np.int64)
    for r in range(rows):
        logical[table_host[r, : used[r]]] = np.arange(used[r])
    # Per query block: the union of its rows' blocks (sorted, as the kernels expect).
    q_blocks = -(-tokens // Q_BLOCK)
    per_block = []
    for b in range(q_blocks):
        block_rows = np.unique(owner[b * Q_BLOCK : (b + 1) * Q_BLOCK])
        per_block.append(np.unique(np.concatenate([table_host[r, : used[r]] for r in block_rows])))
    widest = max(len(ids) for ids in per_block)
    kv_indices = np.zeros((q_blocks, widest), dtype=np.int32)
    for b, ids in enumerate(per_block):
        kv_indices[b, : len(ids)] = ids
    kv_count = np.array([len(ids) for ids in per_block], dtype=np.int32)
    # The kernels visit whole query blocks: the padding queries past `tokens` belong to
    # row 0 at position -1, so they see nothing.
    padded = q_blocks * Q_BLOCK
    owner_t = torch.from_numpy(np.pad(owner, (0, padded - tokens))).to(device)
    logical_t = torch.from_numpy(logical).to(device)
    positions = torch.full((padded,), -1, dtype=torch.int64, device=device)
    positions[:tokens] = step.positions

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
                 ) -> torch.Tensor:
        block = kv // block_size
        index = logical_t[block]
        row = owner_t[q]
        # index * block_size + offset ≤ position < the row's context keeps `index` inside
        # the row's real (unpadded) table.
        own = table[row, index.clamp(max=table.shape[1] - 1)] == block
        return own & (index * block_size + kv % block_size <= positions[q])

    return BlockMask.from_kv_blocks(
        torch.from_numpy(kv_count).to(device)[None, None],
        torch.from_numpy(kv_indices).to(device)[None, None],
        BLOCK_SIZE=(Q_BLOCK, block_size), mask_mod=mask_mod,
        seq_lengths=(tokens, num_blocks * block_size), compute_q_blocks=False,  # no backward
    )


class FlexPagedAttention:
    """The model's `Attention` for one step: store this step's K/V, then one flex call."""

    def __init__(
        self, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
        slot_mapping: torch.Tensor, block_mask: BlockMask, scale: float,
        attend: FlexFn = flex_attention,
    ) -> None:
        self.k_cache, self.v_cache = k_cache, v_cache
        self.slot_mapping, self.block_mask, self.scale = slot_mapping, block_mask, scale
        self.attend = attend

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        kc, vc = self.k_cache[layer], self.v_cache[layer]
        _, _, kv_heads, head_dim = kc.shape
        flat_k, flat_v = kc.view(-1, kv_heads, head_dim), vc.view(-1, kv_heads, head_dim)
        flat_k.index_copy_(0, self.slot_mapping, k.to(kc.dtype))
        flat_v.index_copy_(0, self.slot_mapping, v.to(vc.dtype))
        out = self.attend(
            q.to(kc.dtype).transpose(0, 1)[None],  # [1, heads, tokens, dim]
            flat_k.transpose(0, 1)[None],  # [1, kv_heads, slots, dim]
            flat_v.transpose(0, 1)[None],
            block_mask=self.block_mask, scale=self.scale, enable_gqa=True,
        )
        return out[0].transpose(0, 1).to(q.dtype)  # [tokens, heads, dim]
