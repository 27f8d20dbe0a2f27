"""Load a GGUF file (llama.cpp's format) into `LlamaForCausalLM`.

The configuration comes from the file's `<arch>.*` metadata, the tensors are renamed
to Hugging Face's names and dequantised to the engine's dtype. llama.cpp's converter
reorders the rows of q and k for `llama` models (its rotation pairs adjacent values,
Hugging Face's pairs the two halves of a head): that is undone here. Anything the
engine does not implement (architecture, quantisation, rope variant, sliding window,
experts) is refused with the key or tensor that asks for it.
"""

from __future__ import annotations

import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, TextIO

import torch

from local_backend.model.assemble import build_model
from local_backend.model.checkpoint_files import gguf_path
from local_backend.model.config import LlamaConfig, ModelLoadError
from local_backend.model.cpu_weights import CpuWeights
from local_backend.model.gguf_file import GGUFFile
from local_backend.model.llama import LlamaForCausalLM
from local_backend.model.weight_cache import cached

# general.architecture → Hugging Face model_type; only `llama` has permuted q/k rows.
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
PERMUTED_QK = frozenset({"llama"})
_LAYER = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
LAYER_TENSORS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
TOP_TENSORS = {"token_embd.weight": "model.embed_tokens.weight",
               "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
ROPE_FACTORS = "rope_freqs.weight"  # Llama 3.1's per-frequency divisors
# GGUF tensor types by the CPU weight format that holds them without losing bits.
_TYPES_WITHIN: tuple[tuple[CpuWeights, frozenset[str]], ...] = (
    ("int4", frozenset({"Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K"})),
    ("int8", frozenset({"Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K",
                        "Q6_K", "Q8_0"})),
)


@lru_cache(maxsize=2)
def open_gguf(path: Path) -> GGUFFile:
    """One parse per file for the model, the tokenizer and the generation settings."""
    return GGUFFile(path)


def resolve(path: Path) -> GGUFFile:
    found = gguf_path(Path(path))
    if found is None or not found.is_file():
        raise ModelLoadError(f"{path}: no .gguf file there")
    return open_gguf(found.resolve())


def config_from_gguf(gguf: GGUFFile) -> LlamaConfig:
    meta, where = gguf.metadata, gguf.path
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise ModelLoadError(f"{where}: general.architecture {arch!r} is not supported "
                             f"(supported: {', '.join(ARCHITECTURES)})")

    def key(name: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise ModelLoadError(f"{where}: metadata key {arch}.{name} is missing")
        if isinstance(value, list):
            raise ModelLoadError(f"{where}: {arch}.{name} varies per layer, which this engine "
                                 "does not implement")
        return value

    for unsupported in ("attention.sliding_window", "expert_count"):
        if meta.get(f"{arch}.{unsupported}"):
            raise ModelLoadError(f"{where}: {arch}.{unsupported} is set; sliding-window "
                                 "attention and mixtures of experts are not implemented")
    heads, hidden = int(key("attention.head_count")), int(key("embedding_length"))
    head_dim = int(key("attention.key_length", hidden // heads))
    if int(key("rope.dimension_count", head_dim)) != head_dim:
        raise ModelLoadError(f"{where}: {arch}.rope.dimension_count differs from the head size "
                             "(partial rotary embeddings are not implemented)")
    tokens = meta.get("tokenizer.ggml.tokens") or []
    raw: dict[str, Any] = {
        "model_type": ARCHITECTURES[arch],
        "vocab_size": int(key("vocab_size", len(tokens) or None)),
        "hidden_size": hidden,
        "intermediate_size": int(key("feed_forward_length")),
        "num_hidden_layers": int(key("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(key("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(key("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(key("context_length")),
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        "attention_bias": "blk.0.attn_q.bias" in gguf.tensors,
        "eos_token_id": eos_token_ids(gguf),
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
    }
    scaling = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        raw["rope_scaling"] = {"type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif scaling != "none":
        raise ModelLoadError(f"{where}: {arch}.rope.scaling.type {scaling!r} is not implemented "
                             "(none and linear are)")
    try:
        return LlamaConfig.from_dict(raw)
    except ModelLoadError as exc:
        raise ModelLoadError(f"{where}: {exc}".replace("config.json: ", "")) from None


def eos_token_ids(gguf: GGUFFile) -> list[int]:
    """EOS, plus the end-of-turn / end-of-message tokens a chat model stops at."""
    names = ("eos_token_id", "eot_token_id", "eom_token_id")
    ids = [gguf.metadata.get(f"tokenizer.ggml.{name}") for name in names]
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def stored_weights(path: Path) -> CpuWeights | None:
    """The narrowest CPU weight format as wide as the file's decoder matrices: int4 when
    all are 4-bit (or fewer) quants, int8 when all are quants of at most 8 bits, else
    None (fp32). Q4_1 comes back exactly in int4; other quants are requantised."""
    gguf = resolve(path)
    kinds = {info.kind.name for name, info in gguf.tensors.items()
             if name.startswith("blk.") and len(info.shape) == 2}
    for weights, types in _TYPES_WITHIN:
        if kinds and kinds <= types:
            return weights
    return None


def hf_name(name: str, where: Path) -> str:
    if name in TOP_TENSORS:
        return TOP_TENSORS[name]
    match = _LAYER.fullmatch(name)
    if match is None or match.group(2) not in LAYER_TENSORS:
        raise ModelLoadError(f"{where}: tensor {name!r} is not part of a model this engine "
                             "implements")
    layer, part, kind = match.groups()
    return f"model.layers.{layer}.{LAYER_TENSORS[part]}.{kind}"


def unpermute(tensor: torch.Tensor, heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's `permute`: per head, rows (i, half) back to (half, i)."""
    rows = tensor.shape[0]
    shaped = tensor.reshape(heads, rows // heads // 2, 2, *tensor.shape[1:])
    return shaped.transpose(1, 2).reshape(tensor.shape)


def load_gguf_model(
    path: Path,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    progress: TextIO | None = sys.stderr,
    weights: CpuWeights | None = None,
    cache_dir: Path | None = None,
) -> LlamaForCausalLM:
    """`cache_dir`: keep the converted tensors there for the next start (`weight_cache`)."""
    gguf = resolve(path)
    config = config_from_gguf(gguf)
    arch = gguf.metadata["general.architecture"]
    permuted = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}

    def tensors() -> Any:
        for name in gguf.tensors:
            if name == ROPE_FACTORS:
                continue
            tensor = gguf.read(name)
            part = name.split(".")[2] if name.startswith("blk.") else ""
            if arch in PERMUTED_QK and part in permuted:
                tensor = unpermute(tensor, permuted[part])
            yield gguf.path.name, hf_name(name, gguf.path), tensor

    factors = None
    if ROPE_FACTORS in gguf.tensors:
        factors = gguf.read(ROPE_FACTORS)
    converted = cached(tensors(), cache_dir, gguf.path)
    return build_model(config, converted, source=str(gguf.path), device=device, dtype=dtype,
                       progress=progress, rope_factors=factors, weights=weights)
