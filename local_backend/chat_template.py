"""Render a checkpoint's Jinja chat template (tokenizer_config.json) into a prompt string."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Used only when a checkpoint ships no template: a plain ChatML layout.
FALLBACK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (bad roles, or the template raised)."""


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


TEXT_PARTS = frozenset({"text", "input_text"})


def _flatten(content: Any) -> Any:
    """OpenAI content parts [{"type": "text", "text": ...}] → one string; other shapes
    unchanged. The models read text only: an image, audio or file part is refused
    rather than dropped, so no caller believes the model saw it."""
    if not isinstance(content, list):
        return "" if content is None else content
    texts = []
    for part in content:
        kind = part.get("type", "text") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind not in TEXT_PARTS:
            raise ChatTemplateError(f"content parts of type {kind!r} cannot be sent to "
                                    "this model: it reads text only")
        if not isinstance(part, dict) or not isinstance(part.get("text"), str):
            raise ChatTemplateError("each content part must be an object with a 'text' "
                                    "string")
        texts.append(part["text"])
    return "".join(texts)


class ChatTemplate:
    def __init__(self, source: str | None, *, bos_token: str | None, eos_token: str | None):
        # The environment transformers renders templates in, {% break %}/{% continue %} included.
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source or FALLBACK_TEMPLATE)
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template does not compile: {exc}") from exc
        self._bos, self._eos = bos_token or "", eos_token or ""

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True) -> str:
        prepared = [{**m, "content": _flatten(m.get("content"))} for m in messages]
        try:
            return self._template.render(
                messages=prepared,
                add_generation_prompt=add_generation_prompt,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except ChatTemplateError:
            raise
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from exc
