"""The engine's sampler as it was before it worked on whole-batch tensors: one row at a
time (greedy, temperature, top-k, top-p, per-request seed, logprobs). Kept as the
reference the batched sampler's outputs are compared with."""

from __future__ import annotations

import torch

from local_backend.engine.params import SamplingParams
from local_backend.engine.sampler import TokenLogprob


class Sampler:
    def __init__(self) -> None:
        # One generator per seeded request, so its samples do not depend on batch neighbours.
        self._generators: dict[str, torch.Generator] = {}

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def sample(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams],
        output_ids: list[list[int]] | None = None,
    ) -> tuple[list[int], list[TokenLogprob | None]]:
        """logits [rows, vocab] fp32 → one token id per row (and its logprobs when asked).

        `output_ids` (each row's tokens generated so far) feed the penalties. Logprobs
        stay those of the model's own distribution, as vLLM reports them by default.
        """
        adjusted = _adjust(logits, params, output_ids)
        tokens: list[int] = adjusted.argmax(dim=-1).tolist()
        for row, p in enumerate(params):
            if not p.greedy:
                tokens[row] = self._draw(adjusted[row], request_ids[row], p)
        logprobs: list[TokenLogprob | None] = [None] * len(tokens)
        rows = [row for row, p in enumerate(params) if p.logprobs is not None]
        if rows:
            # One log_softmax and one top-k for every row that asked, not one per row.
            index = torch.tensor(rows, device=logits.device)
            lp = torch.log_softmax(logits.index_select(0, index), dim=-1)
            chosen = lp.gather(1, torch.tensor([[tokens[r]] for r in rows], device=lp.device))
            k = max(params[r].logprobs or 0 for r in rows)
            top = torch.topk(lp, k) if k > 0 else None
            chosen_list = chosen[:, 0].tolist()
            top_ids = top.indices.tolist() if top is not None else [[] for _ in rows]
            top_lps = top.values.tolist() if top is not None else [[] for _ in rows]
            for i, row in enumerate(rows):
                n = params[row].logprobs or 0
                alternatives = list(zip(top_ids[i][:n], top_lps[i][:n], strict=True))
                logprobs[row] = TokenLogprob(tokens[row], chosen_list[i], alternatives)
        return tokens, logprobs

    def _draw(self, row: torch.Tensor, request_id: str, p: SamplingParams) -> int:
        scaled = row / p.temperature
        if p.top_k > 0 and p.top_k < scaled.shape[-1]:
            kth = torch.topk(scaled, p.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            # Drop a token when the tokens ranked above it already reach top_p.
            drop = (torch.cumsum(probs, dim=-1) - probs) > p.top_p
            drop[0] = False
            scaled = scaled.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
        probs = torch.softmax(scaled, dim=-1)
        generator = None
        if p.seed is not None:
            generator = self._generators.get(request_id)
            if generator is None:
                generator = torch.Generator(device=row.device).manual_seed(p.seed)
                self._generators[request_id] = generator
        return int(torch.multinomial(probs, 1, generator=generator).item())


def _adjust(
    logits: torch.Tensor, params: list[SamplingParams], output_ids: list[list[int]] | None
) -> torch.Tensor:
    """OpenAI's penalties and logit_bias: logit − frequency·count − presence·[count > 0] + bias."""
    rows = [row for row, p in enumerate(params) if p.adjusts_logits]
    if not rows:
        return logits
    logits = logits.clone()
    vocab = logits.shape[-1]
    for row in rows:
        p = params[row]
        generated = output_ids[row] if output_ids is not None else []
        if generated and (p.presence_penalty or p.frequency_penalty):
            ids = torch.tensor(generated, dtype=torch.long, device=logits.device)
            counts = torch.bincount(ids, minlength=vocab)[:vocab].to(logits.dtype)
            logits[row] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        if p.logit_bias:
            index = torch.tensor([t for t, _ in p.logit_bias], device=logits.device)
            bias = torch.tensor([b for _, b in p.logit_bias], dtype=logits.dtype,
                                device=logits.device)
            logits[row].index_add_(0, index, bias)
    return logits
