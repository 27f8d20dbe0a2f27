"""No module outside the compat modules (`gateway/compat/`,
`local_backend/aiohttp_compat.py`) touches aiohttp's private parts.

Private, for this check: a module of aiohttp other than `aiohttp`, `aiohttp.web`,
`aiohttp.abc` and `aiohttp.hdrs`; a name those do not export; an underscore attribute
of aiohttp's (read, written, overridden in a subclass, or passed as a keyword); and
changing an object's `__class__`. The underscore names are aiohttp's own, read from its
source, so a module's own `_attribute`s are not mistaken for them; one it defines itself
under the same name as one of aiohttp's is not looked at outside aiohttp's subclasses.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from functools import cache
from pathlib import Path

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[3]
PUBLIC_MODULES = ("aiohttp", "aiohttp.web", "aiohttp.abc", "aiohttp.hdrs")
SELF_NAMES = ("self", "cls")
# public despite the underscore: a named tuple's own API
NAMED_TUPLE_API = frozenset({"_asdict", "_field_defaults", "_fields", "_make", "_replace"})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


@cache
def aiohttp_private_names() -> frozenset[str]:
    """Every underscore name aiohttp's source defines or uses as an attribute."""
    names: set[str] = set()
    for path in Path(aiohttp.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)  # `__slots__` entries
    return frozenset(name for name in names
                     if _private(name) and name.isidentifier() and name not in NAMED_TUPLE_API)


def _aiohttp_has(classes: list[type], name: str) -> bool:
    """An attribute of these classes, one their methods set or read, or a `__slots__`
    entry."""
    for cls in classes:
        if name in vars(cls) or name in (getattr(cls, "__slots__", None) or ()):
            return True
        for member in vars(cls).values():
            code = getattr(getattr(member, "fget", member), "__code__", None)
            if code is not None and name in code.co_names:
                return True
    return False


def _own_names(tree: ast.Module) -> set[str]:
    """Underscore names the module defines for itself: functions, methods, parameters,
    `self._x = …` and class-level assignments, `__slots__` entries."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                and isinstance(node.value, ast.Name) and node.value.id in SELF_NAMES:
            own.add(node.attr)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            own.update(target.id for target in targets if isinstance(target, ast.Name))
            if any(isinstance(target, ast.Name) and target.id == "__slots__"
                   for target in targets) and node.value is not None:
                own.update(c.value for c in ast.walk(node.value)
                           if isinstance(c, ast.Constant) and isinstance(c.value, str))
    return own


def _resolve(expr: ast.expr, names: dict[str, object]) -> object | None:
    if isinstance(expr, ast.Name):
        return names.get(expr.id)
    if isinstance(expr, ast.Attribute):
        base = _resolve(expr.value, names)
        return getattr(base, expr.attr, None) if base is not None else None
    return None


def _is_self(expr: ast.expr) -> bool:
    return (isinstance(expr, ast.Name) and expr.id in SELF_NAMES) or (
        isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name)
        and expr.func.id == "super")


def _imports(tree: ast.Module, problems: list[str]) -> dict[str, object]:
    """What the module binds from aiohttp (and from gateway.compat, whose classes
    derive from aiohttp's); a private import is a problem."""
    names: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "aiohttp":
                    continue
                if alias.name not in PUBLIC_MODULES:
                    problems.append(f"imports {alias.name}")
                bound = alias.asname or alias.name.split(".")[0]
                names[bound] = importlib.import_module(
                    alias.name if alias.asname else alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top != "aiohttp" and not node.module.startswith("gateway.compat"):
                continue
            module = importlib.import_module(node.module)
            exported = getattr(module, "__all__", None)
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                if top == "aiohttp" and (
                        node.module not in PUBLIC_MODULES or _private(alias.name)
                        or (exported is not None and alias.name not in exported
                            and submodule not in PUBLIC_MODULES)):
                    problems.append(f"imports {alias.name} from {node.module}")
                bound = getattr(module, alias.name, None)
                if bound is None and hasattr(module, "__path__") \
                        and importlib.util.find_spec(submodule) is not None:
                    bound = importlib.import_module(submodule)
                names[alias.asname or alias.name] = bound
    return names


def violations(source: str) -> list[str]:
    tree = ast.parse(source)
    problems: list[str] = []
    names = _imports(tree, problems)
    private, own = aiohttp_private_names(), _own_names(tree)
    derived: dict[str, list[type]] = {}  # the module's classes → their aiohttp classes
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        bases: list[type] = []
        for base in node.bases:
            if isinstance(base, ast.Name) and base.id in derived:
                bases += derived[base.id]
            found = _resolve(base, names)
            if isinstance(found, type):
                bases += [c for c in found.__mro__ if c.__module__.startswith("aiohttp")]
        if not bases:
            continue
        derived[node.name] = bases
        for inner in ast.walk(node):
            if isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef) \
                    and _private(inner.name) and _aiohttp_has(bases, inner.name):
                problems.append(f"{node.name} overrides aiohttp's {inner.name}")
            elif isinstance(inner, ast.Attribute) and _is_self(inner.value) \
                    and _private(inner.attr) and _aiohttp_has(bases, inner.attr):
                problems.append(f"{node.name} uses aiohttp's self.{inner.attr}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "__class__" \
                and isinstance(node.ctx, ast.Store):
            problems.append(f"line {node.lineno}: assigns __class__")
        elif isinstance(node, ast.Attribute) and not _is_self(node.value) \
                and node.attr in private and node.attr not in own:
            problems.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in private and node.arg not in own:
            problems.append(f"line {node.value.lineno}: keyword {node.arg}=")
    return problems


def gateway_modules() -> list[Path]:
    return sorted(path for path in (ROOT / "gateway").rglob("*.py")
                  if "compat" not in path.relative_to(ROOT / "gateway").parts)


def test_no_gateway_module_outside_compat_touches_aiohttp_private_names() -> None:
    found = [f"{path.relative_to(ROOT)}: {problem}" for path in gateway_modules()
             for problem in violations(path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


@pytest.mark.parametrize(("source", "expected"), [
    ("from aiohttp.http_writer import StreamWriter\n", "imports StreamWriter"),
    ("import aiohttp.web_protocol\n", "imports aiohttp.web_protocol"),
    ("from aiohttp.web import _something\n", "imports _something"),
    ("from aiohttp import web\n\ndef f(request):\n    return request._payload_writer\n",
     "._payload_writer"),
    ("def f(server, cls):\n    server.__class__ = cls\n", "assigns __class__"),
    ("from aiohttp import web\n\nclass R(web.StreamResponse):\n"
     "    def f(self):\n        return self._eof_sent\n", "self._eof_sent"),
    ("from aiohttp import web\n\nclass R(web.AppRunner):\n"
     "    async def _make_server(self):\n        return await super()._make_server()\n",
     "overrides aiohttp's _make_server"),
    ("from aiohttp import web\n\ndef f():\n    return web.StreamResponse(_real_headers={})\n",
     "keyword _real_headers="),
])
def test_the_check_sees_each_kind_of_private_use(source: str, expected: str) -> None:
    assert any(expected in problem for problem in violations(source)), violations(source)


def test_a_modules_own_underscore_attributes_are_its_business() -> None:
    source = ("import asyncio\n\nclass Pool:\n    def __init__(self):\n"
              "        self._loop = None\n        self._closed = False\n\n"
              "def close(pool):\n    pool._closed = True\n    return pool._loop\n")
    assert violations(source) == []


def test_no_local_backend_module_outside_its_compat_touches_aiohttp_private_names() -> None:
    """The backend is a program of its own: its private uses are in
    `local_backend/aiohttp_compat.py`, checked when it starts serving."""
    paths = sorted(path for path in (ROOT / "local_backend").rglob("*.py")
                   if path.name != "aiohttp_compat.py")
    found = [f"{path.relative_to(ROOT)}: {problem}" for path in paths
             for problem in violations(path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)
