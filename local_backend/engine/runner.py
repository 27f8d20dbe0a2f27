"""Turns a scheduled batch into tensors, runs the model once, and returns logits to sample."""

from __future__ import annotations

import torch

from local_backend.engine.paged_attention import AttentionMetadata, PagedAttention, PrefillChunk
from local_backend.engine.sequence import Sequence
from local_backend.model.llama import LlamaForCausalLM


class ModelRunner:
    def __init__(
        self, model: LlamaForCausalLM, *, num_blocks: int, block_size: int
    ) -> None:
        self.model = model
        config = model.config
        self.device, self.dtype = model.model.norm.weight.device, model.cache_dtype
        self.block_size = block_size
        shape = (num_blocks, block_size, config.num_key_value_heads, config.head_dim)
        self.k_cache = [
            torch.zeros(shape, device=self.device, dtype=self.dtype)
            for _ in range(config.num_hidden_layers)
        ]
        self.v_cache = [torch.zeros_like(t) for t in self.k_cache]
        self.scale = config.head_dim**-0.5

    @staticmethod
    def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int) -> int:
        c = model.config
        element = model.cache_dtype.itemsize
        return 2 * c.num_hidden_layers * block_size * c.num_key_value_heads * c.head_dim * element

    @torch.inference_mode()
    def execute(self, seqs: list[Sequence], num_new: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Compute `num_new` tokens for each sequence (decodes must come first).

        Returns fp32 logits [rows, vocab] for the sequences whose last token was
        computed (they get a new token), and the indices of those sequences.
        """
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        sample_rows: list[int] = []
        sampled: list[int] = []
        decode_tables: list[list[int]] = []
        decode_lens: list[int] = []
        prefills: list[PrefillChunk] = []
        def is_decode(i: int) -> bool:
            return num_new[i] == 1 and 0 < seqs[i].num_computed == seqs[i].num_tokens - 1

        # Decodes first: the attention runs them as one batched call over rows [0, decodes).
        order = sorted(range(len(seqs)), key=lambda i: not is_decode(i))
        for index in order:
            seq, n = seqs[index], num_new[index]
            start, begin = len(ids), seq.num_computed
            end = begin + n
            if is_decode(index):
                tokens = seq.output_ids[-1:] or seq.prompt_ids[-1:]
                decode_tables.append(seq.block_table)
                decode_lens.append(end)
            else:
                tokens = seq.tokens[begin:end]
                table = seq.block_table[: -(-end // bs)]
                prefills.append(
                    PrefillChunk(start, n, end, torch.tensor(table, device=self.device))
                )
            ids.extend(tokens)
            positions.extend(range(begin, end))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(begin, end))
            if end == seq.num_tokens:
                sample_rows.append(start + n - 1)
                sampled.append(index)
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, device=self.device),
            num_decodes=len(decode_tables),
            decode_block_tables=None,
            decode_mask=None,
            prefills=prefills,
        )
        if decode_tables:
            width = max(len(t) for t in decode_tables)
            padded = [t + [0] * (width - len(t)) for t in decode_tables]
            meta.decode_block_tables = torch.tensor(padded, device=self.device)
            lens = torch.tensor(decode_lens, device=self.device)
            keys = torch.arange(width * bs, device=self.device)
            meta.decode_mask = (keys[None, :] < lens[:, None])[:, None, None, :]
        attn = PagedAttention(self.k_cache, self.v_cache, meta, self.scale)
        hidden = self.model(
            torch.tensor(ids, device=self.device),
            torch.tensor(positions, device=self.device),
            attn,
        )
        rows = torch.tensor(sample_rows, device=self.device, dtype=torch.long)
        return self.model.logits(hidden.index_select(0, rows)), sampled
