"""The gateway uses OpenTelemetry through its public API only: the request record is
made into spans by our own code, sampled through `Sampler.should_sample`, and handed to
the SDK's stock span processors (so there is no `gateway/compat/` module for it)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def private_uses(path: Path) -> list[str]:
    """Private names of opentelemetry that `path` imports or reads from what it imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bound: set[str] = set()
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opentelemetry"):
            if any(part.startswith("_") for part in (node.module or "").split(".")):
                found.append(f"from {node.module}")
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{node.module}.{alias.name}")
                bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("opentelemetry"):
                    bound.add((alias.asname or alias.name).split(".")[0])
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                and not node.attr.startswith("__") and isinstance(node.value, ast.Name)
                and node.value.id in bound):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_gateway_module_reaches_into_opentelemetry() -> None:
    offenders = {str(p.relative_to(ROOT)): uses for p in sorted((ROOT / "gateway").rglob("*.py"))
                 if (uses := private_uses(p))}
    assert not offenders


def test_the_check_sees_a_private_use(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from opentelemetry.sdk.trace import TracerProvider\n"
                      "from opentelemetry.sdk.trace.export import _Worker\n"
                      "TracerProvider._active_span_processor\n")
    assert private_uses(module) == ["opentelemetry.sdk.trace.export._Worker",
                                    "TracerProvider._active_span_processor"]
