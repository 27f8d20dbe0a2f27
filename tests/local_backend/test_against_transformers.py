"""The bundled SmolLM2 GGUF, read by the engine and by transformers independently, gives
the same token ids, the same chat prompt, the same logits and the same greedy text.

transformers parses the GGUF file itself (`from_pretrained(dir, gguf_file=...)`): its
own metadata reader, dequantisation, q/k un-permutation and tokenizer conversion.
Both models are loaded once for the module (transformers' load takes most of its time).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import io
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, pre_tokenizers

from local_backend.chat_template import ChatTemplate
from local_backend.checkpoint import Checkpoint, bundled_path, load_checkpoint
from local_backend.engine.loop import Engine, EngineConfig
from local_backend.engine.params import SamplingParams

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

MODEL = "smollm2-135m-instruct"
CORPUS = Path(__file__).parent / "data" / "multilingual_corpus.txt"
# Characters a text editor would not show: no-break, thin and ideographic spaces, combining
# marks, zero-width joiners, CRLF, and runs of newlines and spaces.
INVISIBLE = ["a\u00a0b\u2009c\u3000d", "e\u0301 n\u0303 A\u030a", "a\u200db\u200cc\ufeffd",
             "line one\r\nline two\r\n", "\n\n\n", "x \n \n  \n   y", " ", "\t\t", ""]
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "Give me a synonym for 'happy'.",
    "What do bees make?",
    "Explain in one sentence what a CPU does.",
    "Say hello in Japanese.",
]
GREEDY = SamplingParams(max_tokens=32, temperature=0.0)


def has_numeral(text: str) -> bool:
    """A character of Unicode category N*: what the digit split isolates."""
    return any(unicodedata.category(c).startswith("N") for c in text)


@pytest.fixture(scope="module")
def gguf_file() -> Path:
    return bundled_path(MODEL)  # installed by `make test` (see the Makefile)


@pytest.fixture(scope="module")
def ours(gguf_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return load_checkpoint(MODEL, tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def hf_tokenizer(gguf_file: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)


@pytest.fixture(scope="module")
def hf_model(gguf_file: Path) -> Any:
    with contextlib.redirect_stderr(io.StringIO()):  # its per-tensor progress bar
        model = transformers.AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype=torch.float32
        )
    return model.eval()


def corpus_lines() -> list[str]:
    return [*CORPUS.read_text(encoding="utf-8").split("\n"), *INVISIBLE]


def test_the_corpus_is_long_and_varied() -> None:
    lines = CORPUS.read_text(encoding="utf-8").splitlines()
    assert len(lines) >= 200
    text = "\n".join(lines)
    for sample in ("def ", "😀", "我", "한", "ا", "    ", "\t"):
        assert sample in text


@pytest.fixture(scope="module")
def hf_reference(hf_tokenizer: Any) -> Tokenizer:
    """transformers' conversion of the GGUF vocabulary, merges and special tokens, split as
    SmolLM2's published tokenizer.json splits text (each digit alone, then GPT-2's
    expression). transformers' GGUF converter does not know `tokenizer.ggml.pre` = smollm
    and leaves the digit split out, which changes the ids of numerals that follow a space
    or are not ASCII (llama.cpp, for which GGUF is written, splits them)."""
    reference = copy.deepcopy(hf_tokenizer.backend_tokenizer)
    reference.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    return reference


def test_token_ids_are_identical_line_by_line_and_whole(
    ours: Checkpoint, hf_tokenizer: Any, hf_reference: Tokenizer
) -> None:
    lines = corpus_lines()
    differ = [line for line in lines
              if ours.tokenizer.encode(line) != hf_reference.encode(line).ids]
    assert not differ, differ[:3]
    # Without numerals, transformers' own conversion agrees as it stands.
    plain = [line for line in lines if not has_numeral(line)]
    assert len(plain) > 150
    assert [ours.tokenizer.encode(line) for line in plain] == [
        hf_tokenizer(line).input_ids for line in plain]
    whole = "\n".join(lines)
    ids = ours.tokenizer.encode(whole)
    assert ids == hf_reference.encode(whole).ids
    assert ours.tokenizer.decode(ids) == hf_tokenizer.decode(ids, skip_special_tokens=True)


CONVERSATIONS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in French."},
     {"role": "user", "content": "Bonjour !"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a joke about 🐍 and 数字 123."}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS, ids=["one-turn", "system", "multi-turn"])
def test_the_rendered_chat_prompt_is_identical(ours: Checkpoint, hf_tokenizer: Any,
                                               messages: list[dict[str, str]]) -> None:
    template = ChatTemplate(ours.tokenizer.chat_template, bos_token=ours.tokenizer.bos_token,
                            eos_token=ours.tokenizer.eos_token)
    expected = hf_tokenizer.apply_chat_template(messages, tokenize=False,
                                                add_generation_prompt=True)
    assert template.render(messages) == expected
    assert ours.tokenizer.encode(expected) == hf_tokenizer(expected).input_ids


def chat_ids(ours: Checkpoint, question: str) -> list[int]:
    template = ChatTemplate(ours.tokenizer.chat_template, bos_token=ours.tokenizer.bos_token,
                            eos_token=ours.tokenizer.eos_token)
    return ours.tokenizer.encode(template.render([{"role": "user", "content": question}]))


def test_logits_match_for_a_batch_at_every_position(ours: Checkpoint, hf_model: Any) -> None:
    prompts = [chat_ids(ours, q) for q in QUESTIONS[:4]]
    # One flat batch, as the engine runs it: sequences side by side, each causal on its own.
    flat = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    owner = torch.cat([torch.full((len(p),), i) for i, p in enumerate(prompts)])
    mask = (owner[:, None] == owner[None, :]) & (positions[:, None] >= positions[None, :])

    def attention(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                             v.transpose(0, 1), attn_mask=mask, enable_gqa=True)
        return out.transpose(0, 1)

    with torch.inference_mode():
        mine = ours.model.logits(ours.model(flat, positions, attention))
        expected = torch.cat([hf_model(torch.tensor([p])).logits[0] for p in prompts])
    # Both fp32, summed in different orders (packed q/k/v, oneDNN's GEMM, SDPA vs eager):
    # each matmul rounds at ~1e-7 relative over sums of 576-1536 terms, and 30 residual
    # layers carry that forward. On these 150 positions the logits span -31..40 and the two
    # differ by at most 6e-5; 5e-4 leaves room for other CPUs' kernels, while a real fault
    # (wrong rotation pairs, a missing norm, a dequantisation scale) moves logits by units.
    torch.testing.assert_close(mine, expected, rtol=0, atol=5e-4)
    assert torch.equal(mine.argmax(-1), expected.argmax(-1))


def hf_greedy(hf_model: Any, ids: list[int], eos: tuple[int, ...]) -> list[int]:
    with torch.inference_mode():
        out = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids),
                                dtype=torch.long), max_new_tokens=32, do_sample=False,
                                eos_token_id=list(eos), pad_token_id=eos[0])
    return [int(t) for t in out[0, len(ids):]]


@pytest.fixture(scope="module")
def expected_greedy(ours: Checkpoint, hf_model: Any) -> list[list[int]]:
    return [hf_greedy(hf_model, chat_ids(ours, q), ours.generation.eos_token_ids)
            for q in QUESTIONS]


@contextlib.asynccontextmanager
async def engine_for(ours: Checkpoint, **config: Any) -> AsyncIterator[Engine]:
    engine = Engine(ours.model, ours.tokenizer, EngineConfig(**config),
                    eos_token_ids=ours.generation.eos_token_ids)
    engine.start()
    try:
        yield engine
    finally:
        engine.stop()


async def generate(engine: Engine, request_id: str, ids: list[int]) -> list[int]:
    tokens: list[int] = []
    async for out in engine.generate(request_id, ids, GREEDY):
        tokens += out.token_ids
    return tokens


def strip_eos(tokens: list[int], eos: tuple[int, ...]) -> list[int]:
    return tokens[:-1] if tokens and tokens[-1] in eos else tokens


async def test_greedy_generations_are_identical_one_at_a_time(
    ours: Checkpoint, expected_greedy: list[list[int]]
) -> None:
    eos = ours.generation.eos_token_ids
    async with engine_for(ours, num_blocks=64, block_size=16) as engine:
        for i, question in enumerate(QUESTIONS):
            tokens = await generate(engine, f"alone-{i}", chat_ids(ours, question))
            assert strip_eos(tokens, eos) == strip_eos(expected_greedy[i], eos), question
    assert "Paris" in ours.tokenizer.decode(expected_greedy[0])


async def test_greedy_generations_are_identical_in_a_batch_with_prefix_hits_and_preemption(
    ours: Checkpoint, expected_greedy: list[list[int]]
) -> None:
    eos = ours.generation.eos_token_ids
    prompts = [chat_ids(ours, q) for q in QUESTIONS]
    # 10 sequences of ~40-70 tokens in 32 blocks of 8: they cannot all grow at once, so
    # some are preempted and recomputed; they share the default system prompt's blocks.
    async with engine_for(ours, num_blocks=32, block_size=8, max_num_batched_tokens=64
                          ) as engine:
        results = await asyncio.gather(*(
            generate(engine, f"batch-{i}", ids) for i, ids in enumerate(prompts)
        ))
        stats = engine.stats()
        hits = engine.blocks.cache_hits
    assert stats.preemptions > 0
    assert hits > 0
    for question, tokens, expected in zip(QUESTIONS, results, expected_greedy, strict=True):
        assert strip_eos(tokens, eos) == strip_eos(expected, eos), question
