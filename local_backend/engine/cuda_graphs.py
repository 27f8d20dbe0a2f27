"""CUDA graphs for decode-only steps, one per batch-size bucket, over static input buffers.

A decode step of n sequences replays the graph of the smallest bucket ≥ n: the first n
rows of the static buffers hold the step's inputs, the rest are padding rows whose K/V
go to a scratch block past the cache's real blocks (the block manager never hands it
out) and whose outputs are dropped. The graph runs the gather + SDPA attention with the
table width fixed at the longest context the engine allows. Graphs are captured on
first use of their bucket, in one memory pool. Only on CUDA; on CPU this module is
imported but never builds a graph.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

import torch

from local_backend.engine.attention.paged import AttentionMetadata, PagedAttention

# Batch sizes a graph is captured for (vLLM's pattern: small sizes dense, then steps of 8).
DEFAULT_BUCKETS = (1, 2, 4, *range(8, 257, 8))


def decode_buckets(max_num_seqs: int, buckets: tuple[int, ...] = DEFAULT_BUCKETS
                   ) -> tuple[int, ...]:
    """The buckets an engine of `max_num_seqs` needs: those below it, and one that holds it."""
    kept = tuple(b for b in sorted(buckets) if b < max_num_seqs)
    return (*kept, max_num_seqs)


def bucket_for(rows: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket that holds `rows` decodes, or None when none does."""
    if rows < 1:
        return None
    at = bisect_left(buckets, rows)
    return buckets[at] if at < len(buckets) else None


Forward = Callable[[torch.Tensor, torch.Tensor, PagedAttention], torch.Tensor]


class DecodeGraphs:
    """Captured decode steps over `k_cache`/`v_cache`, whose last block is the scratch block."""

    def __init__(
        self, forward: Forward, k_cache: list[torch.Tensor], v_cache: list[torch.Tensor],
        *, buckets: tuple[int, ...], max_blocks: int, block_size: int, scale: float,
        hidden_size: int, dtype: torch.dtype,
    ) -> None:
        device = k_cache[0].device
        self.forward, self.k_cache, self.v_cache = forward, k_cache, v_cache
        self.buckets, self.block_size, self.scale = buckets, block_size, scale
        self.scratch_slot = (k_cache[0].shape[0] - 1) * block_size
        self.scratch_block = k_cache[0].shape[0] - 1
        rows = buckets[-1]
        self.ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.slots = torch.zeros(rows, dtype=torch.int64, device=device)
        self.tables = torch.zeros(rows, max_blocks, dtype=torch.int64, device=device)
        self.context = torch.ones(rows, dtype=torch.int64, device=device)
        self.keys = torch.arange(max_blocks * block_size, device=device)
        self.hidden = torch.zeros(rows, hidden_size, dtype=dtype, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.pool: Any = None  # one memory pool for every bucket's graph

    def fits(self, rows: int, width: int) -> bool:
        return bucket_for(rows, self.buckets) is not None and width <= self.tables.shape[1]

    def _body(self, rows: int) -> None:
        mask = (self.keys[None, :] < self.context[:rows, None])[:, None, None, :]
        meta = AttentionMetadata(slot_mapping=self.slots[:rows], num_decodes=rows,
                                 decode_block_tables=self.tables[:rows], decode_mask=mask,
                                 prefills=[])
        attn = PagedAttention(self.k_cache, self.v_cache, meta, self.scale)
        self.hidden[:rows] = self.forward(self.ids[:rows], self.positions[:rows], attn)

    def _capture(self, rows: int) -> torch.cuda.CUDAGraph:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # kernels chosen and workspaces sized outside capture
            for _ in range(2):
                self._body(rows)
        torch.cuda.current_stream().wait_stream(stream)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self._body(rows)
        return graph

    def run(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
            tables: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """A decode step of n rows (ids/positions/slots/context [n], tables [n, width])
        → hidden [n, hidden_size] (a view of the static output: use it before the next run)."""
        n, width = tables.shape
        rows = bucket_for(n, self.buckets)
        assert rows is not None
        self.ids[:n].copy_(ids)
        self.positions[:n].copy_(positions)
        self.slots[:n].copy_(slots)
        self.tables[:n, :width].copy_(tables)
        self.tables[:n, width:].fill_(0)
        self.context[:n].copy_(context)
        if rows > n:  # padding rows: write to the scratch block, read one slot of it
            self.ids[n:rows].fill_(0)
            self.positions[n:rows].fill_(0)
            self.slots[n:rows].fill_(self.scratch_slot)
            self.tables[n:rows].fill_(self.scratch_block)
            self.context[n:rows].fill_(1)
        graph = self.graphs.get(rows)
        if graph is None:
            graph = self.graphs[rows] = self._capture(rows)
        graph.replay()
        return self.hidden[:n]
