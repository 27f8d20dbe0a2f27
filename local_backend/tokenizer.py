"""tokenizer.json via the `tokenizers` library, plus incremental detokenisation for streams."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders

from local_backend.model.config import ModelLoadError


def byte_level_alphabet() -> list[str]:
    """GPT-2's printable stand-in character for each byte value (ByteLevel vocabularies)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


_BYTE_OF = {ch: b for b, ch in enumerate(byte_level_alphabet())}
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte tokens


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Tokenizer:
    backend: HFTokenizer
    bos_token: str | None
    eos_token: str | None
    chat_template: str | None

    @classmethod
    def from_dir(cls, directory: Path) -> Tokenizer:
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{directory}: tokenizer.json is missing")
        backend = HFTokenizer.from_file(str(path))
        config: dict[str, Any] = {}
        config_path = Path(directory) / "tokenizer_config.json"
        if config_path.is_file():
            config = json.loads(config_path.read_text(encoding="utf-8"))
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default") or next(iter(named.values()), None)
        jinja = Path(directory) / "chat_template.jinja"
        if template is None and jinja.is_file():  # where recent transformers save it
            template = jinja.read_text(encoding="utf-8")
        return cls(
            backend=backend,
            bos_token=_token_text(config.get("bos_token")),
            eos_token=_token_text(config.get("eos_token")),
            chat_template=template,
        )

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.backend.decode(ids, skip_special_tokens=True))

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes a token stands for, even when they are only part of a character."""
        text = self.decode([token_id])
        if "\ufffd" not in text:
            return text.encode()
        # Decoding alone turns a partial character into U+FFFD: read the vocabulary entry.
        piece = self.backend.id_to_token(token_id) or ""
        if isinstance(self.backend.decoder, decoders.ByteLevel) and all(
            c in _BYTE_OF for c in piece
        ):
            return bytes(_BYTE_OF[c] for c in piece)
        if match := _BYTE_FALLBACK.fullmatch(piece):
            return bytes([int(match.group(1), 16)])
        return text.encode()

    def token_id(self, token: str | None) -> int | None:
        return None if token is None else self.backend.token_to_id(token)


class Detokenizer:
    """Turns a growing list of token ids into text deltas without splitting characters.

    Decodes a small window of recent tokens and only emits text once it no longer
    ends in U+FFFD, so a multi-byte character spread over tokens comes out whole.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-6:])  # context so leading spaces decode as they would
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        return self._delta(final=False)

    def flush(self) -> str:
        return self._delta(final=True)

    def _delta(self, *, final: bool) -> str:
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset])
        text = decode(self.ids[self.prefix_offset :])
        if len(text) > len(prefix) and (final or not text.endswith("\ufffd")):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(prefix) :]
        return ""
