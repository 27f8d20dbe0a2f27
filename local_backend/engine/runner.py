"""Turns a scheduled batch into tensors, runs the model once, and returns logits to sample."""

from __future__ import annotations

from typing import Literal

import torch
from torch.nn.attention.flex_attention import flex_attention

from local_backend.engine.attention.flex import FlexFn, FlexPagedAttention, build_block_mask
from local_backend.engine.attention.paged import AttentionMetadata, PagedAttention, PrefillChunk
from local_backend.engine.capacity import kv_bytes_per_block
from local_backend.engine.cuda_graphs import DecodeGraphs, decode_buckets
from local_backend.engine.sequence import Sequence
from local_backend.engine.step_inputs import StepInputs, StepTensors
from local_backend.model.llama import Attention, LlamaForCausalLM

# "sdpa": gather each row's blocks, SDPA per prefill chunk and one for the decodes (the
# reference); "flex": one FlexAttention call per layer over the cache in place, eager
# (dense: for tests); "flex-compiled": the same through torch.compile.
Backend = Literal["sdpa", "flex", "flex-compiled"]


class ModelRunner:
    def __init__(
        self, model: LlamaForCausalLM, *, num_blocks: int, block_size: int,
        max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
        attention: Backend = "sdpa", cuda_graphs: bool = False, max_model_len: int | None = None,
    ) -> None:
        self.model = model
        config = model.config
        self.device, self.dtype = model.model.norm.weight.device, model.cache_dtype
        self.block_size = block_size
        graphs = cuda_graphs and self.device.type == "cuda" and attention == "sdpa"
        # With graphs, one more block than the manager knows of: the padding rows' sink.
        shape = (num_blocks + graphs, block_size, config.num_key_value_heads, config.head_dim)
        self.k_cache = [
            torch.zeros(shape, device=self.device, dtype=self.dtype)
            for _ in range(config.num_hidden_layers)
        ]
        self.v_cache = [torch.zeros_like(t) for t in self.k_cache]
        self.scale = config.head_dim**-0.5
        # A row's table never outgrows the cache, nor the engine's context (the graphs'
        # static tables and every decode's gather are this wide).
        context = max_model_len or config.max_position_embeddings
        max_blocks = min(num_blocks, -(-context // block_size) + 1)
        self.inputs = StepInputs(
            max_tokens=max_num_batched_tokens, max_rows=max_num_seqs,
            max_blocks_per_row=max_blocks, block_size=block_size, device=self.device)
        self.key_index = torch.arange(max_blocks * block_size, device=self.device)
        self.num_blocks = num_blocks
        self.attention = attention
        self.flex: FlexFn = flex_attention
        self.graphs = DecodeGraphs(
            self.model, self.k_cache, self.v_cache, buckets=decode_buckets(max_num_seqs),
            max_blocks=max_blocks, block_size=block_size, scale=self.scale,
            hidden_size=config.hidden_size, dtype=model.compute_dtype,
        ) if graphs else None
        if attention == "flex-compiled":
            # Shapes change every step: one dynamic graph rather than one per token count.
            self.flex = torch.compile(flex_attention, dynamic=True)

    @staticmethod
    def kv_bytes_per_block(model: LlamaForCausalLM, block_size: int) -> int:
        return kv_bytes_per_block(model, block_size)

    @torch.inference_mode()
    def execute(self, seqs: list[Sequence], num_new: list[int]) -> tuple[torch.Tensor, list[int]]:
        """Compute `num_new` tokens for each sequence (decodes must come first).

        Returns fp32 logits [rows, vocab] for the sequences whose last token was
        computed (they get a new token), and the indices of those sequences.
        """
        def is_decode(i: int) -> bool:
            return num_new[i] == 1 and 0 < seqs[i].num_computed == seqs[i].num_tokens - 1

        # Decodes first: the attention runs them as one batched call over rows [0, decodes).
        order = sorted(range(len(seqs)), key=lambda i: not is_decode(i))
        tokens: list[list[int]] = []
        begins: list[int] = []
        tables: list[list[int]] = []
        sample_rows: list[int] = []
        sampled: list[int] = []
        num_decodes = 0
        for row, index in enumerate(order):
            seq, n = seqs[index], num_new[index]
            begin = seq.num_computed
            if is_decode(index):
                num_decodes += 1
                tokens.append(seq.output_ids[-1:] or seq.prompt_ids[-1:])
            else:
                tokens.append(seq.tokens[begin : begin + n])
            begins.append(begin)
            tables.append(seq.block_table)
            if begin + n == seq.num_tokens:
                sample_rows.append(row)
                sampled.append(index)
        step = self.inputs.write(tokens, begins, tables, sample_rows)
        graphs = self.graphs
        if graphs is not None and num_decodes == step.num_rows and graphs.fits(
                step.num_rows, step.width):
            hidden = graphs.run(step.input_ids, step.positions, step.slot_mapping,
                                step.block_tables, step.context_lens)
            return self.model.logits(hidden.index_select(0, step.sample_rows)), sampled
        attn: Attention
        if self.attention == "sdpa":
            attn = PagedAttention(self.k_cache, self.v_cache, self.metadata(step, num_decodes),
                                  self.scale)
        else:
            mask = build_block_mask(step, self.num_blocks, self.block_size)
            attn = FlexPagedAttention(self.k_cache, self.v_cache, step.slot_mapping, mask,
                                      self.scale, self.flex)
        hidden = self.model(step.input_ids, step.positions, attn)
        return self.model.logits(hidden.index_select(0, step.sample_rows)), sampled

    def metadata(self, step: StepTensors, num_decodes: int) -> AttentionMetadata:
        """The gather + SDPA path's view of a step: decodes padded to their widest table
        (masked past each context), one chunk per prefilling row."""
        bs, d = self.block_size, num_decodes
        meta = AttentionMetadata(slot_mapping=step.slot_mapping, num_decodes=d,
                                 decode_block_tables=None, decode_mask=None, prefills=[])
        context = step.context_host.tolist()
        if d:
            width = -(-max(context[:d]) // bs)
            meta.decode_block_tables = step.block_tables[:d, :width]
            keys = self.key_index[: width * bs]
            meta.decode_mask = (keys[None, :] < step.context_lens[:d, None])[:, None, None, :]
        starts = step.starts_host.tolist()
        for row in range(d, step.num_rows):
            length, end = starts[row + 1] - starts[row], context[row]
            meta.prefills.append(PrefillChunk(starts[row], length, end,
                                              step.block_tables[row, : -(-end // bs)]))
        return meta
