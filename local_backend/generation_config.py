"""generation_config.json: the checkpoint's EOS ids and its default sampling settings."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from local_backend.tokenizer import Tokenizer


@dataclass(frozen=True)
class GenerationConfig:
    eos_token_ids: tuple[int, ...] = ()
    # Used when a request leaves them out (as vLLM does with a checkpoint's file).
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    @classmethod
    def from_dir(
        cls, directory: Path, config_eos: tuple[int, ...], tokenizer: Tokenizer
    ) -> GenerationConfig:
        """EOS ids merged from generation_config.json, config.json and the tokenizer."""
        raw: dict[str, Any] = {}
        path = Path(directory) / "generation_config.json"
        if path.is_file():
            raw = json.loads(path.read_text(encoding="utf-8"))
        return cls.from_ids(config_eos, tokenizer, raw)

    @classmethod
    def from_ids(
        cls, config_eos: tuple[int, ...], tokenizer: Tokenizer, raw: dict[str, Any] | None = None
    ) -> GenerationConfig:
        """The same from the model's EOS ids and the tokenizer (a GGUF has no such file)."""
        raw = raw or {}
        ids = list(config_eos)
        value = raw.get("eos_token_id")
        ids += value if isinstance(value, list) else [] if value is None else [value]
        token = tokenizer.token_id(tokenizer.eos_token)
        if token is not None:
            ids.append(token)
        return cls(
            eos_token_ids=tuple(dict.fromkeys(int(i) for i in ids)),
            temperature=float(raw.get("temperature", 1.0)),
            top_p=float(raw.get("top_p", 1.0)),
            top_k=int(raw.get("top_k", 0) or 0),
        )
