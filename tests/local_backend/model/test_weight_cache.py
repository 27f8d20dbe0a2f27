"""Converted GGUF tensors kept on disk: a second load reads them instead of converting
the file again, and a changed source or a damaged entry is never served stale."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from gguf import GGMLQuantizationType
from hypothesis import given, settings
from hypothesis import strategies as st

from local_backend.model.config import LlamaConfig
from local_backend.model.loader import load_model
from local_backend.model.weight_cache import SUBDIRECTORY, entry_path
from tests.local_backend import reference
from tests.local_backend.conftest import TINY
from tests.local_backend.gguf_writer import write_gguf
from tests.local_backend.model.test_loader import IDS, model_logits

CONFIG = {**TINY, "vocab_size": 260, "tie_word_embeddings": True}


def tiny_gguf(path: Path, state: dict[str, torch.Tensor], scale: float = 1.0
              ) -> dict[str, torch.Tensor]:
    tied = {k: v * scale for k, v in state.items() if k != "lm_head.weight"}
    return write_gguf(path, CONFIG, tied, quant=GGMLQuantizationType.Q4_1)


def logits(directory: Path, cache: Path) -> torch.Tensor:
    model = load_model(directory, dtype=torch.float64, progress=None, cache_dir=cache)
    return model_logits(model, IDS).double()


def expected(held: dict[str, torch.Tensor]) -> torch.Tensor:
    return reference.logits(held, LlamaConfig.from_dict(CONFIG), IDS)


def overwrite_keeping_identity(path: Path, other: Path) -> None:
    """Replace `path`'s bytes by `other`'s (same size) and restore its modification time:
    to the cache, still the same file."""
    stat = path.stat()
    data = other.read_bytes()
    assert len(data) == stat.st_size
    path.write_bytes(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_second_load_reads_the_converted_tensors_not_the_file(
        tmp_path: Path, tiny_state: dict[str, torch.Tensor]) -> None:
    source, cache = tmp_path / "m.gguf", tmp_path / "cache"
    held = tiny_gguf(source, tiny_state)
    torch.testing.assert_close(logits(source, cache), expected(held), rtol=1e-6, atol=1e-6)
    assert [p.name for p in (cache / SUBDIRECTORY).iterdir()] == [
        entry_path(cache, source).name]
    # Other weights under the same identity: only a load from the cache still gives the
    # first file's logits.
    tiny_gguf(tmp_path / "other.gguf", tiny_state, scale=0.5)
    overwrite_keeping_identity(source, tmp_path / "other.gguf")
    torch.testing.assert_close(logits(source, cache), expected(held), rtol=1e-6, atol=1e-6)


def test_a_changed_source_is_converted_again(
        tmp_path: Path, tiny_state: dict[str, torch.Tensor]) -> None:
    source, cache = tmp_path / "m.gguf", tmp_path / "cache"
    tiny_gguf(source, tiny_state)
    logits(source, cache)
    held = tiny_gguf(source, tiny_state, scale=0.5)  # rewritten: a new modification time
    os.utime(source, ns=(0, source.stat().st_mtime_ns + 1))
    torch.testing.assert_close(logits(source, cache), expected(held), rtol=1e-6, atol=1e-6)


@settings(max_examples=8, deadline=None)
@given(keep=st.integers(min_value=0, max_value=4096))
def test_a_damaged_entry_is_ignored_and_rewritten(
        tmp_path_factory: pytest.TempPathFactory, tiny_state: dict[str, torch.Tensor],
        keep: int) -> None:
    """Whatever prefix of the entry survives (a crash while copying it, a full disk),
    the load converts the file instead, and leaves a whole entry for the next one."""
    tmp_path = tmp_path_factory.mktemp("damaged")
    source, cache = tmp_path / "m.gguf", tmp_path / "cache"
    held = tiny_gguf(source, tiny_state)
    logits(source, cache)
    entry = entry_path(cache, source)
    whole = entry.read_bytes()
    entry.write_bytes(whole[:keep])
    torch.testing.assert_close(logits(source, cache), expected(held), rtol=1e-6, atol=1e-6)
    assert entry.read_bytes() == whole
