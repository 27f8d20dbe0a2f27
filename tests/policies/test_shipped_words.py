"""What the shipped policy and its reference tell a new user names things that exist."""

from __future__ import annotations

import re
from pathlib import Path

from policies import load, loads
from policies.schema import LaunchSpec

DEFAULT = Path(__file__).parents[2] / "policies" / "default.yaml"


def test_targets_named_in_the_default_policys_comments_exist() -> None:
    policy = load(DEFAULT, environ={})
    comments = "\n".join(line.split("#", 1)[1] for line in DEFAULT.read_text().splitlines()
                         if "#" in line)
    named = set(re.findall(r"`([a-z0-9-]+/[a-z0-9.-]+)`", comments))
    assert named and named <= set(policy.targets)


def test_launch_model_reference_names_every_kind_of_model_it_takes() -> None:
    described = LaunchSpec.model_fields["model"].description or ""
    assert ".gguf" in described and "demo" in described
    # the bundled model the default policy launches (local_backend.checkpoint.BUNDLED)
    launched = {backend.launch.model for backend in load(DEFAULT, environ={}).file
                .backends.values() if backend.launch is not None}
    assert launched and all(f"`{name}`" in described for name in launched)


def test_the_policies_in_the_docs_load() -> None:
    docs = Path(__file__).parents[2] / "docs"
    blocks = [block for page in ("vllm.md",) for block in re.findall(
        r"```yaml\n(.*?)```", (docs / page).read_text(), re.S) if block.startswith("version:")]
    assert blocks
    for block in blocks:
        loads(block.replace("sha256:...", "sha256:" + "0" * 64), environ={})
