"""Attention over the paged KV cache, implementing the model's `Attention` protocol.

Cache layout per layer: [num_blocks, block_size, kv_heads, head_dim]. A step's
tokens are laid out decodes first (one token each), then prefill chunks. Decodes
run as one SDPA call over their gathered, padded block tables; each prefill chunk
runs its own call (causal within the chunk, full view of its cached prefix).

On CPU, attention is computed in fp32 even where q/k/v or the cache are bf16/fp16:
torch's CPU attention kernels are far slower in bf16 than in fp32 on CPUs without AMX
(docs/benchmarks.md), and the scores and softmax are more precise for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PrefillChunk:
    start: int  # offset of the chunk in the step's flat token batch
    length: int  # tokens in the chunk
    context: int  # tokens visible to the chunk's last query (cached prefix + chunk)
    block_ids: torch.Tensor  # [ceil(context / block_size)] physical blocks, in order


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [tokens] flat cache slot each new token's K/V goes to
    num_decodes: int
    decode_block_tables: torch.Tensor | None  # [decodes, max_blocks], padded with block 0
    decode_mask: torch.Tensor | None  # [decodes, 1, 1, max_blocks * block_size] bool
    prefills: list[PrefillChunk]


class PagedAttention:
    def __init__(
        self,
        k_cache: list[torch.Tensor],
        v_cache: list[torch.Tensor],
        meta: AttentionMetadata,
        scale: float,
    ) -> None:
        self.k_cache, self.v_cache, self.meta, self.scale = k_cache, v_cache, meta, scale

    def __call__(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        kc, vc, meta = self.k_cache[layer], self.v_cache[layer], self.meta
        num_blocks, _, kv_heads, head_dim = kc.shape
        kc.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, k.to(kc.dtype))
        vc.view(-1, kv_heads, head_dim).index_copy_(0, meta.slot_mapping, v.to(vc.dtype))
        dtype, work = q.dtype, self.work_dtype(q)
        if work != dtype:
            q, k, v = q.to(work), k.to(work), v.to(work)
        blocks_k, blocks_v = kc.view(num_blocks, -1), vc.view(num_blocks, -1)

        def gather(blocks: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            """ids [n] → [n * block_size, kv_heads, dim] in the working dtype."""
            rows = blocks.index_select(0, ids)  # one copy, faster than advanced indexing
            return rows.view(-1, kv_heads, head_dim).to(work)

        d = meta.num_decodes
        # A step of decodes only (the common case) needs no output buffer to fill.
        out = q if d == q.shape[0] else torch.empty_like(q)
        if d:
            assert meta.decode_block_tables is not None
            tables = meta.decode_block_tables  # [decodes, max_blocks]
            # → [decodes, max_blocks * block, kv_heads, dim] → [decodes, kv_heads, keys, dim]
            keys = gather(blocks_k, tables.flatten()).view(d, -1, kv_heads, head_dim)
            values = gather(blocks_v, tables.flatten()).view(d, -1, kv_heads, head_dim)
            decoded = F.scaled_dot_product_attention(
                q[:d].unsqueeze(2),  # [decodes, heads, 1, dim]
                keys.transpose(1, 2),
                values.transpose(1, 2),
                attn_mask=meta.decode_mask,
                scale=self.scale,
                enable_gqa=True,
            ).squeeze(2)
            if out is q:
                return decoded.to(dtype)
            out[:d] = decoded
        for chunk in meta.prefills:
            s, n = chunk.start, chunk.length
            query = q[s : s + n].transpose(0, 1)  # [heads, n, dim]
            if chunk.context == n:  # nothing cached before: attend to the chunk's own K/V
                keys, values = k[s : s + n].transpose(0, 1), v[s : s + n].transpose(0, 1)
                mask = None
            else:
                keys = gather(blocks_k, chunk.block_ids)[: chunk.context].transpose(0, 1)
                values = gather(blocks_v, chunk.block_ids)[: chunk.context].transpose(0, 1)
                # Query i sits at position context - n + i and sees keys 0..that position.
                rows = torch.arange(n, device=q.device)[:, None] + (chunk.context - n)
                mask = torch.arange(chunk.context, device=q.device)[None, :] <= rows
            out[s : s + n] = F.scaled_dot_product_attention(
                query, keys, values, attn_mask=mask, is_causal=mask is None,
                scale=self.scale, enable_gqa=True,
            ).transpose(0, 1)
        return out.to(dtype)

    @staticmethod
    def work_dtype(q: torch.Tensor) -> torch.dtype:
        if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
            return torch.float32
        return q.dtype
