"""GGUF files load into the same model their source checkpoint describes, or are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType

from local_backend.checkpoint import load_checkpoint
from local_backend.model.config import LlamaConfig, ModelLoadError
from local_backend.model.loader import load_model
from tests.local_backend import reference
from tests.local_backend.conftest import TINY
from tests.local_backend.gguf_writer import write_gguf
from tests.local_backend.model.test_loader import IDS, model_logits

QUANTS = [GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.Q8_0,
          GGMLQuantizationType.Q4_1]


def gguf_config(**overrides: object) -> dict[str, object]:
    return {**TINY, "vocab_size": 260, "tie_word_embeddings": True, **overrides}


@pytest.mark.parametrize("quant", QUANTS, ids=lambda q: q.name)
def test_a_quantised_llama_gguf_computes_what_its_weights_say(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], quant: GGMLQuantizationType
) -> None:
    # q/k rows are stored permuted as llama.cpp writes them: an unpermuted load would
    # rotate the wrong pairs of values and miss the reference by far more than 1e-6.
    config = gguf_config()
    state = {k: v for k, v in tiny_state.items() if k != "lm_head.weight"}
    held = write_gguf(tmp_path / "m.gguf", config, state, quant=quant)
    model = load_model(tmp_path / "m.gguf", dtype=torch.float64, progress=None)
    expected = reference.logits(held, LlamaConfig.from_dict(config), IDS)
    torch.testing.assert_close(model_logits(model, IDS).double(), expected, rtol=1e-6, atol=1e-6)


def test_an_untied_gguf_loads_its_output_matrix(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor]
) -> None:
    config = gguf_config(tie_word_embeddings=False)
    held = write_gguf(tmp_path / "m.gguf", config, tiny_state, quant=GGMLQuantizationType.F32)
    model = load_model(tmp_path, dtype=torch.float64, progress=None)  # the directory holding it
    assert not model.config.tie_word_embeddings
    expected = reference.logits(held, LlamaConfig.from_dict(config), IDS)
    torch.testing.assert_close(model_logits(model, IDS).double(), expected, rtol=1e-6, atol=1e-6)


def test_the_tokenizer_template_and_eos_come_from_the_metadata(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor]
) -> None:
    state = {k: v for k, v in tiny_state.items() if k != "lm_head.weight"}
    write_gguf(tmp_path / "tiny.gguf", gguf_config(), state)
    checkpoint = load_checkpoint(str(tmp_path / "tiny.gguf"), tmp_path)
    assert checkpoint.name == "tiny"
    assert checkpoint.tokenizer.encode("héllo") == [104, 0xC3, 0xA9, 108, 108, 111]
    assert checkpoint.tokenizer.encode("<|im_end|>") == [259]  # a control token stays whole
    assert checkpoint.tokenizer.eos_token == "<|im_end|>"
    assert "<|im_start|>" in (checkpoint.tokenizer.chat_template or "")
    assert checkpoint.generation.eos_token_ids == (259,)


@pytest.mark.parametrize(("metadata", "arch", "named"), [
    ({}, "gemma2", "general.architecture 'gemma2'"),
    ({"llama.attention.sliding_window": 64}, "llama", "llama.attention.sliding_window"),
    ({"llama.expert_count": 8}, "llama", "llama.expert_count"),
    ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, "llama",
     "rope.scaling.type 'yarn'"),
    ({"llama.rope.dimension_count": 8}, "llama", "partial rotary"),
])
def test_what_the_engine_does_not_implement_is_refused_by_name(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor], metadata: dict[str, object],
    arch: str, named: str,
) -> None:
    write_gguf(tmp_path / "m.gguf", gguf_config(tie_word_embeddings=False), tiny_state,
               arch=arch, metadata=metadata)
    with pytest.raises(ModelLoadError, match=named.replace("(", r"\(")) as error:
        load_model(tmp_path / "m.gguf", progress=None)
    assert "m.gguf" in str(error.value)


def test_an_unsupported_quantisation_is_refused_naming_the_tensor(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor]
) -> None:
    write_gguf(tmp_path / "m.gguf", gguf_config(tie_word_embeddings=False), tiny_state,
               quant=GGMLQuantizationType.Q8_1)
    with pytest.raises(ModelLoadError, match=r"tensor '[a-z_.0-9]+' is quantised as Q8_1"):
        load_model(tmp_path / "m.gguf", progress=None)


def test_an_unknown_pre_tokenizer_is_refused(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor]
) -> None:
    write_gguf(tmp_path / "m.gguf", gguf_config(tie_word_embeddings=False), tiny_state,
               pre="tekken")
    with pytest.raises(ModelLoadError, match=r"tokenizer\.ggml\.pre 'tekken' is not supported"):
        load_checkpoint(str(tmp_path / "m.gguf"), tmp_path)


def test_a_truncated_or_foreign_file_is_refused(
    tmp_path: Path, tiny_state: dict[str, torch.Tensor]
) -> None:
    write_gguf(tmp_path / "m.gguf", gguf_config(tie_word_embeddings=False), tiny_state)
    data = (tmp_path / "m.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) - 100])
    with pytest.raises(ModelLoadError, match="runs past the end of the file"):
        load_model(tmp_path / "cut.gguf", progress=None)
    (tmp_path / "other.gguf").write_bytes(b"PK\x03\x04" + data[4:])
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(tmp_path / "other.gguf", progress=None)
    with pytest.raises(ModelLoadError, match=r"several \.gguf files"):
        load_model(tmp_path, progress=None)
