"""Writes a small checkpoint as llama.cpp's converter would: GGUF metadata, q/k rows
permuted for `llama`, tensors quantised with the `gguf` package."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quant_shape_to_byte_shape, quantize

from local_backend.demo import CHAT_TEMPLATE, SPECIAL_TOKENS
from local_backend.tokenizer import byte_level_alphabet

UNQUANTISABLE = (GGMLQuantizationType.Q8_1,)  # the gguf package cannot write these
HF_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}


def gguf_name(hf: str) -> str:
    if hf in TOP:
        return TOP[hf]
    _, _, layer, rest = hf.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{HF_TO_GGUF[module]}.{kind}"


def permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py `LlamaModel.permute`, verbatim in effect."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(
        w.shape)


def write_gguf(
    path: Path,
    config: dict[str, Any],
    state: dict[str, torch.Tensor],
    *,
    quant: GGMLQuantizationType = GGMLQuantizationType.Q8_0,
    arch: str = "llama",
    metadata: dict[str, Any] | None = None,
    pre: str = "gpt-2",
) -> dict[str, torch.Tensor]:
    """Writes `state` (HF names) to `path`; returns the state as the file holds it
    (quantised and dequantised again, HF row order), for a reference to run."""
    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    tokens = [*byte_level_alphabet(), *SPECIAL_TOKENS]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 256 + [3] * len(SPECIAL_TOKENS))
    writer.add_token_merges([])
    writer.add_bos_token_id(256)
    writer.add_eos_token_id(259)
    writer.add_chat_template(CHAT_TEMPLATE)
    for key, value in (metadata or {}).items():
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, float):
            writer.add_float32(key, value)
        else:
            writer.add_uint32(key, value)
    held: dict[str, torch.Tensor] = {}
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    for name, tensor in state.items():
        original = tensor.float().numpy()
        part = name.split(".")[-2]
        array = permute(original, heads[part]) if arch == "llama" and part in heads else original
        if array.ndim == 2 and quant in UNQUANTISABLE:  # bytes of the right size
            shape = quant_shape_to_byte_shape(array.shape, quant)
            writer.add_tensor(gguf_name(name), np.zeros(shape, np.uint8), raw_dtype=quant)
        elif array.ndim == 2 and quant != GGMLQuantizationType.F32:
            writer.add_tensor(gguf_name(name), quantize(array, quant), raw_dtype=quant)
            # Rows are quantised one by one, so the unpermuted rows quantise to the same values.
            original = dequantize(quantize(original, quant), quant)
        else:
            writer.add_tensor(gguf_name(name), array)
        held[name] = torch.from_numpy(np.array(original)).double()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held
