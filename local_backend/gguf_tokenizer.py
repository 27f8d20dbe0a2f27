"""The tokenizer a GGUF file describes (`tokenizer.ggml.*`), rebuilt with `tokenizers`.

Byte-level BPE only (`tokenizer.ggml.model` = gpt2, which Llama 3, Qwen2 and SmolLM
use). The text is first split as llama.cpp splits it for the variant named by
`tokenizer.ggml.pre`; an unknown variant is refused, since guessing would give wrong
ids without any error.
"""

from __future__ import annotations

from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from local_backend.model.config import ModelLoadError
from local_backend.model.gguf_file import GGUFFile
from local_backend.tokenizer import Tokenizer

CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values of added tokens
# llama.cpp's split expressions (llama-vocab.cpp), by the name in tokenizer.ggml.pre.
LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
GPT2_STYLE = ("gpt-2", "gpt2", "phi-2", "roberta-bpe", "olmo")
LLAMA3_STYLE = ("llama3", "llama-v3", "llama-bpe", "falcon3")


def _byte_level(use_regex: bool) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)


def pre_tokenizer(variant: str, where: str) -> pre_tokenizers.PreTokenizer:
    if variant in GPT2_STYLE:  # GPT-2's expression is the one ByteLevel applies
        return _byte_level(True)
    if variant == "smollm":  # every digit alone, then GPT-2's expression
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r"\p{N}"), "isolated"), _byte_level(True)]
        )
    if variant in LLAMA3_STYLE or variant == "qwen2":
        pattern = QWEN2 if variant == "qwen2" else LLAMA3
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(pattern), "isolated"), _byte_level(False)]
        )
    supported = (*GPT2_STYLE, "smollm", *LLAMA3_STYLE, "qwen2")
    raise ModelLoadError(f"{where}: tokenizer.ggml.pre {variant!r} is not supported "
                         f"(supported: {', '.join(supported)})")


def tokenizer_from_gguf(gguf: GGUFFile) -> Tokenizer:
    meta, where = gguf.metadata, str(gguf.path)
    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(f"{where}: tokenizer.ggml.model {kind!r} is not supported (only "
                             "'gpt2', byte-level BPE)")
    tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
    merges: list[str] = meta.get("tokenizer.ggml.merges") or []
    if not tokens:
        raise ModelLoadError(f"{where}: tokenizer.ggml.tokens is missing")
    types: list[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    variant = str(meta.get("tokenizer.ggml.pre", "gpt-2"))
    splitter = pre_tokenizer(variant, where)
    pairs = []
    for merge in merges:
        left, _, right = merge.partition(" ")
        pairs.append((left, right))
    vocab = {token: i for i, token in enumerate(tokens)}
    backend = HFTokenizer(models.BPE(vocab=vocab, merges=pairs,
                                     ignore_merges=variant in LLAMA3_STYLE))
    backend.pre_tokenizer = splitter
    backend.decoder = decoders.ByteLevel()
    backend.add_tokens([
        AddedToken(tokens[i], special=types[i] == CONTROL, normalized=False)
        for i in range(len(tokens)) if types[i] in (CONTROL, USER_DEFINED)
    ])

    def text(key: str) -> str | None:
        token_id = meta.get(f"tokenizer.ggml.{key}")
        return tokens[token_id] if token_id is not None and 0 <= token_id < len(tokens) else None

    bos, eos = text("bos_token_id"), text("eos_token_id")
    # llama.cpp's default: a BOS for the Llama 3 family, none for the others.
    if meta.get("tokenizer.ggml.add_bos_token", variant in LLAMA3_STYLE) and bos is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, vocab[bos])]
        )
    template: Any = meta.get("tokenizer.chat_template")
    return Tokenizer(backend=backend, bos_token=bos, eos_token=eos,
                     chat_template=template if isinstance(template, str) else None)
