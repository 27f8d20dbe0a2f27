"""Next-token choice for a whole batch at once: greedy, temperature, top-k, top-p, min-p,
penalties, logit bias and per-request seeds as per-row tensors.

A step makes one device-to-host copy, of the chosen ids; logprobs are computed (and
copied) only for the rows that ask for them. A draw is `argmax(probs / q)` with `q`
exponential noise, which is what `torch.multinomial` does for one sample: a seeded row
fills its `q` from its own generator, so its tokens are the ones a per-row
`multinomial` with that generator gives, whatever its batch neighbours are.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from local_backend.engine.params import SamplingParams


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # the n most likely ids and their logprobs


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
        adjusted = adjust_logits(logits, params, output_ids)
        tokens = adjusted.argmax(dim=-1)  # [rows] int64, on the logits' device
        drawn = [row for row, p in enumerate(params) if not p.greedy]
        if drawn:
            index = torch.tensor(drawn, device=logits.device)
            chosen = self._draw(adjusted.index_select(0, index), [request_ids[r] for r in drawn],
                                [params[r] for r in drawn])
            tokens.index_copy_(0, index, chosen)
        token_list: list[int] = tokens.tolist()  # the step's one device → host copy
        return token_list, _logprobs(logits, tokens, token_list, params)

    def _draw(
        self, logits: torch.Tensor, request_ids: list[str], params: list[SamplingParams]
    ) -> torch.Tensor:
        """logits [n, vocab] of the rows that sample → token ids [n] (on the device)."""
        device, dtype = logits.device, logits.dtype
        vocab = logits.shape[-1]
        temperature = torch.tensor([p.temperature for p in params], dtype=dtype, device=device)
        scaled = logits / temperature[:, None]
        top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        if min(top_k) < vocab:
            k = torch.tensor(top_k, device=device)[:, None] - 1
            kth = torch.topk(scaled, max(top_k)).values.gather(1, k)  # [n, 1] k-th largest
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if any(p.top_p < 1.0 for p in params):
            top_p = torch.tensor([p.top_p for p in params], dtype=dtype, device=device)[:, None]
            sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            # Drop a token when the tokens ranked above it already reach top_p; rows at 1.0
            # drop nothing (a cumulative sum that rounds past 1 must not cut their tail).
            drop = ((torch.cumsum(probs, dim=-1) - probs) > top_p) & (top_p < 1.0)
            drop[:, 0] = False
            scaled = scaled.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
        probs = torch.softmax(scaled, dim=-1)  # [n, vocab]
        if any(p.min_p > 0.0 for p in params):
            min_p = torch.tensor([p.min_p for p in params], dtype=dtype, device=device)[:, None]
            floor = probs.amax(dim=-1, keepdim=True) * min_p
            probs = probs.masked_fill(probs < floor, 0.0)  # the draw needs no renormalising
        noise = torch.empty_like(probs).exponential_(1)
        for row, (request_id, p) in enumerate(zip(request_ids, params, strict=True)):
            if p.seed is not None:
                noise[row].exponential_(1, generator=self._generator(request_id, p.seed, device))
        return (probs / noise).argmax(dim=-1)

    def _generator(self, request_id: str, seed: int, device: torch.device) -> torch.Generator:
        generator = self._generators.get(request_id)
        if generator is None:
            generator = torch.Generator(device=device).manual_seed(seed)
            self._generators[request_id] = generator
        return generator


def adjust_logits(
    logits: torch.Tensor, params: list[SamplingParams], output_ids: list[list[int]] | None
) -> torch.Tensor:
    """OpenAI's penalties and logit_bias: logit − frequency·count − presence·[count > 0] + bias."""
    if not any(p.adjusts_logits for p in params):
        return logits
    logits = logits.clone()
    device, vocab = logits.device, logits.shape[-1]
    penalised = [
        row for row, p in enumerate(params)
        if (p.presence_penalty or p.frequency_penalty) and output_ids and output_ids[row]
    ]
    if penalised:
        generated = [output_ids[row] for row in penalised] if output_ids else []
        ids = torch.tensor([t for seen in generated for t in seen], device=device)
        owner = torch.repeat_interleave(
            torch.arange(len(penalised), device=device),
            torch.tensor([len(seen) for seen in generated], device=device))
        counts = torch.zeros(len(penalised), vocab, dtype=logits.dtype, device=device)
        counts.index_put_((owner, ids), torch.ones((), dtype=logits.dtype, device=device),
                          accumulate=True)  # [penalised, vocab] times each id was generated
        frequency = torch.tensor([params[r].frequency_penalty for r in penalised],
                                 dtype=logits.dtype, device=device)[:, None]
        presence = torch.tensor([params[r].presence_penalty for r in penalised],
                                dtype=logits.dtype, device=device)[:, None]
        index = torch.tensor(penalised, device=device)
        logits.index_copy_(0, index, logits.index_select(0, index)
                           - (frequency * counts + presence * (counts > 0)))
    biased = [(row, token, bias) for row, p in enumerate(params) for token, bias in p.logit_bias]
    if biased:
        rows, tokens, values = zip(*biased, strict=True)
        logits.index_put_(
            (torch.tensor(rows, device=device), torch.tensor(tokens, device=device)),
            torch.tensor(values, dtype=logits.dtype, device=device), accumulate=True)
    return logits


def _logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, token_list: list[int],
    params: list[SamplingParams],
) -> list[TokenLogprob | None]:
    out: list[TokenLogprob | None] = [None] * len(params)
    rows = [row for row, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return out
    # One log_softmax and one top-k for every row that asked, not one per row.
    index = torch.tensor(rows, device=logits.device)
    lp = torch.log_softmax(logits.index_select(0, index), dim=-1)
    chosen = lp.gather(1, tokens.index_select(0, index)[:, None])[:, 0].tolist()
    k = max(params[r].logprobs or 0 for r in rows)
    top = torch.topk(lp, k) if k > 0 else None
    top_ids = top.indices.tolist() if top is not None else [[] for _ in rows]
    top_lps = top.values.tolist() if top is not None else [[] for _ in rows]
    for i, row in enumerate(rows):
        n = params[row].logprobs or 0
        alternatives = list(zip(top_ids[i][:n], top_lps[i][:n], strict=True))
        out[row] = TokenLogprob(token_list[row], chosen[i], alternatives)
    return out
