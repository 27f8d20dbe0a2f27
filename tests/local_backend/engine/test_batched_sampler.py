"""The batched sampler gives the per-row sampler's tokens and logprobs for the same seeds."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from local_backend.engine.params import SamplingParams
from local_backend.engine.sampler import Sampler
from tests.local_backend.engine.reference_sampler import Sampler as ReferenceSampler

VOCAB = 300
DEVICES = [
    "cpu",
    pytest.param("cuda", marks=[
        pytest.mark.gpu,
        pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
]

row_params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.6]),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
    top_k=st.sampled_from([0, 1, 5, 50, VOCAB, VOCAB + 3]),
    seed=st.integers(0, 2**31 - 1),
    logprobs=st.sampled_from([None, 0, 3]),
    presence_penalty=st.sampled_from([0.0, 0.5, -1.0]),
    frequency_penalty=st.sampled_from([0.0, 0.25, 1.5]),
    logit_bias=st.lists(st.tuples(st.integers(0, VOCAB - 1), st.sampled_from([-100.0, 2.5])),
                        max_size=3).map(tuple),
)


def run_both(device: str, params: list[SamplingParams], steps: int, seed: int
             ) -> tuple[list[object], list[object]]:
    """Both samplers over the same logits for `steps` steps, each row's output fed back."""
    logits_gen = torch.Generator().manual_seed(seed)
    ids = [f"r{i}" for i in range(len(params))]
    batched, reference = Sampler(), ReferenceSampler()
    outputs: list[list[int]] = [[] for _ in params]
    got, want = [], []
    for _ in range(steps):
        logits = (torch.randn(len(params), VOCAB, generator=logits_gen) * 4).to(device)
        tokens, lps = batched.sample(logits, ids, params, outputs)
        ref_tokens, ref_lps = reference.sample(logits, ids, params, outputs)
        got.append((tokens, lps))
        want.append((ref_tokens, ref_lps))
        for row, token in enumerate(ref_tokens):
            outputs[row].append(token)
    return got, want


@pytest.mark.parametrize("device", DEVICES)
@settings(max_examples=40, deadline=None)
@given(params=st.lists(row_params, min_size=1, max_size=6), seed=st.integers(0, 1000))
def test_seeded_rows_draw_what_the_per_row_sampler_draws(
    device: str, params: list[SamplingParams], seed: int
) -> None:
    got, want = run_both(device, params, 4, seed)
    assert got == want


@pytest.mark.parametrize("device", DEVICES)
def test_a_seeded_row_does_not_depend_on_its_neighbours(device: str) -> None:
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(5)).to(device) * 3
    seeded = SamplingParams(temperature=1.0, seed=7)
    alone, _ = Sampler().sample(logits[1:2], ["s"], [seeded])
    crowded, _ = Sampler().sample(
        logits, ["a", "s", "b"], [SamplingParams(temperature=0.9), seeded,
                                  SamplingParams(temperature=0.0)])
    assert crowded[1] == alone[0]


def test_min_p_never_draws_a_token_below_its_share_of_the_top_probability() -> None:
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(3)) * 2
    probs = torch.softmax(logits[0], -1)
    allowed = set((probs >= 0.2 * probs.max()).nonzero()[:, 0].tolist())
    sampler = Sampler()
    drawn = {sampler.sample(logits, [f"r{i}"], [SamplingParams(min_p=0.2, seed=i)])[0][0]
             for i in range(200)}
    assert drawn <= allowed
    assert len(drawn) > 1  # still a draw, not greedy
    unfiltered = {Sampler().sample(logits, [f"r{i}"], [SamplingParams(seed=i)])[0][0]
                  for i in range(200)}
    assert not unfiltered <= allowed  # without min_p the tail is reachable
