"""The bundled model answers the README tour's questions right at the server's defaults.
Its GGUF carries no generation config, and at the engine's general default (temperature
1.0) "What is the capital of France?" got "Les Bayons…"; a request that leaves out
`temperature` and `top_p` now gets the bundled model's own defaults (greedy: at the
model card's 0.2 / 0.9 the first token is a near tie, see `local_backend.checkpoint`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from local_backend.checkpoint import Checkpoint, load_checkpoint
from local_backend.engine.loop import Engine, EngineConfig
from local_backend.server.app import create_app

pytestmark = pytest.mark.slow
MODEL = "smollm2-135m-instruct"
ASKED = 3  # each question, several times: every answer must be right


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return load_checkpoint(MODEL, tmp_path_factory.mktemp("cache"), weights="auto")


@pytest.fixture
async def client(checkpoint: Checkpoint) -> AsyncIterator[TestClient[Any, Any]]:
    engine = Engine(checkpoint.model, checkpoint.tokenizer,
                    EngineConfig(num_blocks=256, max_model_len=2048),
                    eos_token_ids=checkpoint.generation.eos_token_ids)
    app = create_app(engine, model_name=MODEL, defaults=checkpoint.generation)
    async with TestClient(TestServer(app)) as test_client:
        yield test_client


def test_the_bundled_model_has_sampling_defaults_of_its_own(checkpoint: Checkpoint) -> None:
    assert (checkpoint.generation.temperature, checkpoint.generation.top_p) == (0.0, 1.0)


async def ask(client: TestClient[Any, Any], question: str) -> str:
    body = {"model": MODEL, "max_tokens": 40,  # no temperature, no top_p: the defaults
            "messages": [{"role": "user", "content": question}]}
    async with client.post("/v1/chat/completions", json=body) as response:
        assert response.status == 200
        reply = await response.json()
    return str(reply["choices"][0]["message"]["content"])


@pytest.mark.parametrize(("question", "right"), [
    ("What is the capital of France?", lambda answer: "Paris" in answer),
    ("Hi", lambda answer: any(w in answer.lower() for w in ("hello", "hi", "hey"))),
])
async def test_the_tours_questions_are_answered_right_at_the_defaults(
        client: TestClient[Any, Any], question: str, right: Any) -> None:
    answers = [await ask(client, question) for _ in range(ASKED)]
    assert all(right(answer) for answer in answers), answers
