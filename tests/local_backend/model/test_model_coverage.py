"""Qwen3 and Llama with attention biases compute what transformers computes; what the
engine does not implement is refused at load, by name, rather than computed wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from local_backend.model.config import LlamaConfig, ModelLoadError
from local_backend.model.loader import load_model
from tests.local_backend.conftest import TINY, make_checkpoint
from tests.local_backend.model.test_loader import IDS, model_logits

QWEN3 = {**TINY, "model_type": "qwen3", "head_dim": 32, "tie_word_embeddings": True,
         "sliding_window": None, "use_sliding_window": False, "rope_theta": 1e6}


@pytest.mark.parametrize(("config", "hf_class"), [
    (QWEN3, "Qwen3ForCausalLM"),
    ({**TINY, "attention_bias": True}, "LlamaForCausalLM"),
], ids=["qwen3-qk-norm", "llama-attention-bias"])
def test_the_model_matches_transformers(
    tmp_path: Path, config: dict[str, Any], hf_class: str
) -> None:
    transformers = pytest.importorskip("transformers")
    directory = make_checkpoint(tmp_path, config)
    hf = getattr(transformers, hf_class).from_pretrained(directory, dtype=torch.float64)
    with torch.inference_mode():
        expected = hf(torch.tensor([IDS])).logits[0]
    model = load_model(directory, dtype=torch.float64, progress=None)
    # As in test_loader: fp32 rotary frequencies one ulp apart move fp64 logits ~1e-6.
    torch.testing.assert_close(model_logits(model, IDS).double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("change", "named"), [
    ({"model_type": "mistral", "sliding_window": 128}, "sliding_window 128"),
    ({"model_type": "qwen2", "sliding_window": 128, "use_sliding_window": True},
     "sliding_window 128"),
    ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act 'gelu_pytorch_tanh'"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling type 'yarn'"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_scaling type 'dynamic'"),
])
def test_an_unimplemented_setting_is_refused_by_name(change: dict[str, Any], named: str) -> None:
    with pytest.raises(ModelLoadError, match=named):
        LlamaConfig.from_dict({**TINY, **change})


def test_a_window_switched_off_or_absent_is_not_refused() -> None:
    assert LlamaConfig.from_dict({**TINY, "model_type": "qwen2", "sliding_window": 4096,
                                  "use_sliding_window": False}).model_type == "qwen2"
    assert LlamaConfig.from_dict({**TINY, "model_type": "mistral", "sliding_window": None})
