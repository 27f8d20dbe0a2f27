"""No product code awaits through `asyncio.wait_for`.

On Python 3.11 `wait_for` can swallow a cancellation that arrives in the same loop
turn as its inner awaitable finishing (or timing out): the caller carries on as if
never cancelled. In a supervisor's `while` loop that is a task that never stops, and a
gateway that hangs after SIGTERM. `asyncio.timeout` (or `asyncio.wait(…, timeout=…)`)
has no such window, so the whole class is ruled out here rather than case by case.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("gateway", "routing", "policies", "local_backend")


def _wait_for_calls(source: str) -> list[int]:
    return [getattr(node, "lineno", 0) for node in ast.walk(ast.parse(source))
            if _is_asyncio_wait_for(node) or _imports_wait_for(node)]


def _is_asyncio_wait_for(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "wait_for"
            and isinstance(node.value, ast.Name) and node.value.id == "asyncio")


def _imports_wait_for(node: ast.AST) -> bool:
    return (isinstance(node, ast.ImportFrom) and node.module == "asyncio"
            and any(alias.name == "wait_for" for alias in node.names))


def test_the_scan_finds_both_spellings() -> None:
    assert _wait_for_calls("import asyncio\nasyncio.wait_for(x, 1)\n") == [2]
    assert _wait_for_calls("from asyncio import wait_for\n") == [1]
    assert _wait_for_calls("async with asyncio.timeout(1):\n    pass\n") == []


def test_no_product_module_uses_asyncio_wait_for() -> None:
    found = [f"{path.relative_to(ROOT)}:{line}"
             for package in PACKAGES
             for path in sorted((ROOT / package).rglob("*.py"))
             for line in _wait_for_calls(path.read_text())]
    assert found == [], "use asyncio.timeout instead of asyncio.wait_for: " + ", ".join(found)
