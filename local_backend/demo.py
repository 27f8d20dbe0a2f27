"""The `--model demo` checkpoint: a small random Llama written as an ordinary HF directory.

It is created once (fixed seed, ~20M parameters, byte-level tokenizer with a ChatML
template) and then loaded through the normal loader, so the engine has no demo path.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

from local_backend.model.config import LlamaConfig
from local_backend.model.llama import checkpoint_layout
from local_backend.tokenizer import byte_level_alphabet

# Bump when the layout below changes so a stale cache is not reused.
DEMO_VERSION = 2
SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
DEMO_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256 + len(SPECIAL_TOKENS),
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
    "bos_token_id": 256,
    "eos_token_id": [257, 259],
    "torch_dtype": "float32",
}


def byte_tokenizer() -> Tokenizer:
    # GPT-2's printable stand-in for each byte, so token id == byte value.
    vocab = {ch: i for i, ch in enumerate(byte_level_alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 256)]
    )
    return tok


def write_checkpoint(
    directory: Path, config: dict[str, Any], *, seed: int = 0, shards: int = 1, std: float = 0.02
) -> None:
    """Random-initialised weights saved in HF layout; several shards on request."""
    directory.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in checkpoint_layout(LlamaConfig.from_dict(config)).items():
        if name.endswith("norm.weight"):
            state[name] = torch.ones(shape)
        else:
            state[name] = torch.randn(shape, generator=generator) * std
    names = list(state)
    if shards == 1:
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    else:
        weight_map = {}
        for i in range(shards):
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: state[n].contiguous() for n in names[i::shards]}
            save_file(part, str(directory / shard), metadata={"format": "pt"})
            weight_map.update({n: shard for n in part})
        index = {"metadata": {}, "weight_map": weight_map}
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    (directory / "config.json").write_text(json.dumps(config, indent=2))


def write_tokenizer(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    byte_tokenizer().save(str(directory / "tokenizer.json"))
    tokenizer_config = {
        "bos_token": "<|begin_of_text|>",
        "eos_token": "<|im_end|>",
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": DEMO_CONFIG["max_position_embeddings"],
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    generation = {"bos_token_id": 256, "eos_token_id": [257, 259]}
    (directory / "generation_config.json").write_text(json.dumps(generation, indent=2))


def ensure_demo_model(cache_dir: Path) -> Path:
    """The demo checkpoint directory under `cache_dir`, created on first use."""
    target = Path(cache_dir) / f"demo-model-v{DEMO_VERSION}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename, so a concurrent start never sees half a directory.
    staging = Path(tempfile.mkdtemp(prefix=".demo-", dir=target.parent))
    try:
        write_tokenizer(staging)
        write_checkpoint(staging, DEMO_CONFIG, seed=0)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
