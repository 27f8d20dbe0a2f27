"""The CPU weight formats (bf16, int8, int4) on the bundled SmolLM2 GGUF: their logits stay
as close to the fp32 reference as llama.cpp's own 4-bit computation on the same file, and
their greedy answers are still right.

The reference is the engine in fp32, which test_against_transformers holds to
transformers within 5e-4. The formats differ from it for two reasons: activations are
rounded to bf16 (8-bit mantissa) at every projection, and the weights are stored in
fewer bits (int4 keeps the file's Q4_1 levels exactly, int8 requantises them per row).
llama.cpp's server, run on the same file and prompts (docs/benchmarks.md), differs from
the same reference by mean |Δlogit| 0.21, max 1.8, mean KL 0.005: it rounds activations
to 8-bit blocks. The bounds below are twice those; a real fault (a wrong zero offset,
swapped nibbles, a scale on the wrong axis) moves logits by units everywhere.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from local_backend import torch_compat
from local_backend.chat_template import ChatTemplate
from local_backend.checkpoint import Checkpoint, auto_weights, bundled_path, load_checkpoint
from local_backend.engine.loop import Engine, EngineConfig
from local_backend.engine.params import SamplingParams
from local_backend.model.cpu_weights import CPU_WEIGHTS, CpuWeights

pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
QUESTIONS = ["What is the capital of France?", "Name three primary colours.",
             "Write a haiku about the sea.", "What is 12 times 12?"]
MEAN_ABS_DIFF = 0.42  # mean |Δlogit| over every position and vocabulary entry
MAX_ABS_DIFF = 3.5
MEAN_KL = 0.01  # nats, reference ‖ format, per position
CONFIDENT_MARGIN = 1.0  # logits: where the reference's best beats its second by this much,
# the greedy choice must be the same (at lesser margins the two may be a near-tie)


def chat_ids(checkpoint: Checkpoint, question: str) -> list[int]:
    tokenizer = checkpoint.tokenizer
    template = ChatTemplate(tokenizer.chat_template, bos_token=tokenizer.bos_token,
                            eos_token=tokenizer.eos_token)
    return tokenizer.encode(template.render([{"role": "user", "content": question}]))


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def fp32(cache: Path) -> Checkpoint:
    return load_checkpoint(MODEL, cache)


@pytest.fixture(scope="module", params=CPU_WEIGHTS)
def lowp(request: pytest.FixtureRequest, cache: Path) -> tuple[CpuWeights, Checkpoint]:
    if not torch_compat.has_bf16_linear():
        pytest.skip("this CPU has no bf16 matrix instructions (AVX-512 or AVX-NE-CONVERT)")
    weights: CpuWeights = request.param
    return weights, load_checkpoint(MODEL, cache, weights=weights)


def every_position_logits(checkpoint: Checkpoint, prompts: list[list[int]]) -> torch.Tensor:
    """fp32 logits [positions, vocab] of the prompts run side by side, each causal alone."""
    flat = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    owner = torch.cat([torch.full((len(p),), i) for i, p in enumerate(prompts)])
    mask = (owner[:, None] == owner[None, :]) & (positions[:, None] >= positions[None, :])

    def attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.float().transpose(0, 1) for t in (q, k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                              enable_gqa=True).transpose(0, 1)

    with torch.inference_mode():
        return checkpoint.model.logits(checkpoint.model(flat, positions, attention))


def test_the_bundled_4_bit_gguf_defaults_to_int4_weights_where_the_cpu_computes_bf16() -> None:
    expected = "int4" if torch_compat.has_bf16_linear() else None  # else fp32
    assert auto_weights(bundled_path(MODEL)) == expected


def test_logits_stay_within_twice_llama_cpps_distance_from_fp32(
    fp32: Checkpoint, lowp: tuple[CpuWeights, Checkpoint]
) -> None:
    weights, checkpoint = lowp
    prompts = [chat_ids(fp32, q) for q in QUESTIONS]
    expected = every_position_logits(fp32, prompts)
    got = every_position_logits(checkpoint, prompts)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    diff = (got - expected).abs()
    reference_lp, got_lp = expected.log_softmax(-1), got.log_softmax(-1)
    kl = (reference_lp.exp() * (reference_lp - got_lp)).sum(-1)
    assert diff.mean() <= MEAN_ABS_DIFF, weights
    assert diff.max() <= MAX_ABS_DIFF, weights
    assert kl.mean() <= MEAN_KL, weights
    best_two = expected.topk(2, dim=-1).values
    confident = best_two[:, 0] - best_two[:, 1] >= CONFIDENT_MARGIN
    assert confident.sum() > len(confident) // 3  # the check below has positions to check
    assert torch.equal(got.argmax(-1)[confident], expected.argmax(-1)[confident]), weights


async def greedy_answer(checkpoint: Checkpoint, question: str) -> str:
    engine = Engine(checkpoint.model, checkpoint.tokenizer,
                    EngineConfig(num_blocks=64, block_size=16),
                    eos_token_ids=checkpoint.generation.eos_token_ids)
    engine.start()
    try:
        text = ""
        params = SamplingParams(max_tokens=48, temperature=0.0)
        async for out in engine.generate("q", chat_ids(checkpoint, question), params):
            text += out.text
        return text
    finally:
        engine.stop()


@pytest.mark.parametrize(("question", "answer"), [
    ("What is the capital of France?", "Paris"),
    ("Who wrote Romeo and Juliet?", "Shakespeare"),
])
async def test_greedy_answers_stay_right(
    lowp: tuple[CpuWeights, Checkpoint], question: str, answer: str
) -> None:
    weights, checkpoint = lowp
    text = await greedy_answer(checkpoint, question)
    assert answer.lower() in text.lower(), (weights, text)
