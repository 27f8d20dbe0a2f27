"""A step's integer inputs written into one persistent buffer, sent to the device in one copy.

Every step needs the same few integer arrays: token ids, positions, the cache slot of
each new token, each sequence's context length, where its tokens start in the batch,
which rows are sampled, and the block tables. Building each with `torch.tensor(list)`
costs an allocation and a conversion per array per step; here they are written through
numpy views into one int64 host buffer allocated once (pinned when the device is CUDA),
and the device sees them as slices of one device buffer filled by a single
`non_blocking` copy. On CPU the host buffer is the device buffer.

Layout of a step, in the flat buffer: [ids | positions | slots | context | starts |
sample rows | tables (rows × width, padded with block 0)].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class StepTensors:
    """Device views of one step's inputs (valid until the next step is written)."""

    input_ids: torch.Tensor  # [tokens]
    positions: torch.Tensor  # [tokens]
    slot_mapping: torch.Tensor  # [tokens] flat cache slot each new token's K/V goes to
    context_lens: torch.Tensor  # [rows] tokens each row's last query sees (cached + new)
    query_starts: torch.Tensor  # [rows + 1] offset of each row's tokens; the last is `tokens`
    sample_rows: torch.Tensor  # [sampled] token index whose logits are sampled
    block_tables: torch.Tensor  # [rows, width] physical blocks, padded with block 0
    # The same context lengths, starts and tables, read on the host without a copy back.
    context_host: np.ndarray
    starts_host: np.ndarray
    tables_host: np.ndarray
    num_tokens: int
    num_rows: int
    width: int


class StepInputs:
    """Persistent buffers for steps of at most `max_tokens` tokens and `max_rows` sequences."""

    def __init__(
        self, *, max_tokens: int, max_rows: int, max_blocks_per_row: int, block_size: int,
        device: torch.device,
    ) -> None:
        self.block_size = block_size
        self.device = device
        self.capacity = 3 * max_tokens + 3 * max_rows + 1 + max_rows * max_blocks_per_row
        pin = device.type == "cuda"
        self.host = torch.zeros(self.capacity, dtype=torch.int64, pin_memory=pin)
        self.view = self.host.numpy()
        self.on_device = self.host if device.type == "cpu" else torch.zeros(
            self.capacity, dtype=torch.int64, device=device)

    def write(
        self, tokens: list[list[int]], begins: list[int], tables: list[list[int]],
        sampled: list[int],
    ) -> StepTensors:
        """Row r computes `tokens[r]` at positions begins[r].., with blocks `tables[r]`;
        `sampled` are the rows whose last token's logits are sampled."""
        rows = len(tokens)
        lengths = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=rows)
        n = int(lengths.sum())
        width = max(len(t) for t in tables)
        buf, bs = self.view, self.block_size
        ids, pos, slots = buf[:n], buf[n : 2 * n], buf[2 * n : 3 * n]
        at = 3 * n
        context, starts = buf[at : at + rows], buf[at + rows : at + 2 * rows + 1]
        at += 2 * rows + 1
        sample = buf[at : at + len(sampled)]
        at += len(sampled)
        table = buf[at : at + rows * width].reshape(rows, width)
        end = at + rows * width
        if end > self.capacity:
            raise ValueError(f"a step of {n} tokens in {rows} rows over {width} blocks does "
                             "not fit the step buffers")
        starts[0] = 0
        np.cumsum(lengths, out=starts[1:])
        table.fill(0)
        offset = 0
        for row, (row_tokens, begin, blocks) in enumerate(zip(tokens, begins, tables,
                                                              strict=True)):
            k = len(row_tokens)
            ids[offset : offset + k] = row_tokens
            pos[offset : offset + k] = np.arange(begin, begin + k)
            table[row, : len(blocks)] = blocks
            offset += k
        begin_arr = pos[starts[:-1]]
        context[:] = begin_arr + lengths
        owner = np.repeat(np.arange(rows), lengths)
        slots[:] = table[owner, pos // bs] * bs + pos % bs
        sample[:] = starts[1:][sampled] - 1
        device = self.on_device
        if device is not self.host:
            device[:end].copy_(self.host[:end], non_blocking=True)
        return StepTensors(
            input_ids=device[:n], positions=device[n : 2 * n], slot_mapping=device[2 * n : 3 * n],
            context_lens=device[3 * n : 3 * n + rows],
            query_starts=device[3 * n + rows : 3 * n + 2 * rows + 1],
            sample_rows=device[3 * n + 2 * rows + 1 : at],
            block_tables=device[at:end].view(rows, width),
            context_host=context, starts_host=starts, tables_host=table,
            num_tokens=n, num_rows=rows, width=width,
        )
