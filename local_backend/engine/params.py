"""What a request asks of sampling: the engine's own form of the API's parameters."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    min_p: float = 0.0  # drop tokens below min_p × the top token's probability; 0 = off
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()  # EOS ids; generation ends on any of them
    ignore_eos: bool = False
    logprobs: int | None = None  # None = off; n ≥ 0 = the chosen token plus n alternatives
    presence_penalty: float = 0.0  # subtracted once from every token already generated
    frequency_penalty: float = 0.0  # subtracted per time a token was already generated
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit)

    @property
    def adjusts_logits(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 1e-5 or self.top_k == 1
