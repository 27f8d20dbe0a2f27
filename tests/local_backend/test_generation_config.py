"""generation_config.json: EOS ids from every source, and sampling defaults for requests."""

from __future__ import annotations

import json
from pathlib import Path

from local_backend.demo import write_tokenizer
from local_backend.generation_config import GenerationConfig
from local_backend.server.protocol import parse
from local_backend.tokenizer import Tokenizer

CHAT = [{"role": "user", "content": "Say something."}]


def test_generation_config_supplies_eos_ids_and_sampling_defaults(tmp_path: Path) -> None:
    write_tokenizer(tmp_path)  # its eos_token is <|im_end|> (259)
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [257, 300], "temperature": 0.6, "top_p": 0.9, "top_k": 20}))
    defaults = GenerationConfig.from_dir(tmp_path, (2,), Tokenizer.from_dir(tmp_path))
    assert defaults.eos_token_ids == (2, 257, 300, 259)
    chat = parse({"messages": CHAT}, chat=True, defaults=defaults)
    assert (chat.params.temperature, chat.params.top_p, chat.params.top_k) == (0.6, 0.9, 20)
    explicit = parse({"messages": CHAT, "temperature": 0}, chat=True, defaults=defaults)
    assert explicit.params.temperature == 0
