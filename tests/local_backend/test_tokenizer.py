"""tokenizer.json round trips, streaming detokenisation, and chat templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from local_backend.chat_template import ChatTemplate, ChatTemplateError
from local_backend.demo import write_tokenizer
from local_backend.engine.sampler import TokenLogprob
from local_backend.server.protocol import logprobs_body
from local_backend.tokenizer import Detokenizer, Tokenizer

TEXT = "héllo wörld ✓ 你好 🙂!"


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    directory = tmp_path_factory.mktemp("tok")
    write_tokenizer(directory)
    return Tokenizer.from_dir(directory)


def test_encode_adds_bos_and_decode_drops_it(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(TEXT)
    assert ids[0] == tokenizer.token_id("<|begin_of_text|>")
    assert tokenizer.decode(ids) == TEXT


def test_streamed_deltas_never_split_a_character(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    detok = Detokenizer(tokenizer, tokenizer.encode("prompt"))
    deltas = [detok.add(i) for i in ids] + [detok.flush()]
    assert "".join(deltas) == TEXT
    assert all("\ufffd" not in d for d in deltas)


def test_special_tokens_come_from_tokenizer_config(tokenizer: Tokenizer) -> None:
    assert tokenizer.bos_token == "<|begin_of_text|>"
    assert tokenizer.eos_token == "<|im_end|>"


def test_chat_template_renders_chatml_with_content_parts(tokenizer: Tokenizer) -> None:
    template = ChatTemplate(tokenizer.chat_template, bos_token=tokenizer.bos_token,
                            eos_token=tokenizer.eos_token)
    text = template.render([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text",
                                                                    "text": "there"}]},
    ])
    assert text == ("<|begin_of_text|><|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize(("content", "message"), [
    ([{"type": "text", "text": "Look: "}, {"type": "image_url", "image_url": {"url": "x"}}],
     "type 'image_url' cannot be sent to this model"),
    ([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}],
     "type 'input_audio' cannot be sent"),
    (["just a string"], "must be an object with a 'text' string"),
    ([{"type": "text", "text": 3}], "must be an object with a 'text' string"),
], ids=["image", "audio", "bare-string", "text-not-a-string"])
def test_a_part_the_model_cannot_read_is_refused_not_dropped(content: list[object],
                                                             message: str) -> None:
    template = ChatTemplate(None, bos_token=None, eos_token=None)
    with pytest.raises(ChatTemplateError, match=message):
        template.render([{"role": "user", "content": content}])


def test_template_raise_exception_becomes_a_chat_template_error() -> None:
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}"
        "{% endif %}", bos_token=None, eos_token=None,
    )
    with pytest.raises(ChatTemplateError, match="first must be user"):
        template.render([{"role": "assistant", "content": "x"}])


def test_missing_tokenizer_json_is_named(tmp_path: Path) -> None:
    from local_backend.model.config import ModelLoadError

    with pytest.raises(ModelLoadError, match=r"tokenizer\.json"):
        Tokenizer.from_dir(tmp_path)


def test_chat_logprob_bytes_are_the_tokens_own_bytes(tokenizer: Tokenizer) -> None:
    # Each byte of a multi-byte character is its own token here: its logprob entry must
    # carry that byte, so a client joining the entries' bytes gets the text back.
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    items = [TokenLogprob(i, -1.0, [(i, -1.0)]) for i in ids]
    body = logprobs_body(tokenizer, items, chat=True)
    joined = bytes(b for entry in body["content"] for b in entry["bytes"])
    assert joined.decode() == TEXT
    assert body["content"][1]["top_logprobs"][0]["bytes"] == list("é".encode()[:1])


def test_chat_template_saved_beside_the_tokenizer_is_used(tmp_path: Path) -> None:
    # Recent transformers write the template to chat_template.jinja, not tokenizer_config.json.
    write_tokenizer(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    del config["chat_template"]
    config_path.write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    )
    tokenizer = Tokenizer.from_dir(tmp_path)
    template = ChatTemplate(tokenizer.chat_template, bos_token=None, eos_token=None)
    assert template.render([{"role": "user", "content": "hi"}]) == "[hi]"


def test_templates_may_use_loop_controls_as_transformers_allows() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% if m['role'] == 'stop' %}{% break %}{% endif %}"
        "{{ m['content'] }}{% endfor %}", bos_token=None, eos_token=None,
    )
    messages = [{"role": "user", "content": "a"}, {"role": "stop", "content": "b"}]
    assert template.render(messages, add_generation_prompt=False) == "a"
