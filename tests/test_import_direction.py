"""The one direction of dependency: policies ← routing ← gateway; local_backend alone."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("policies", "routing", "gateway", "local_backend")
ALLOWED = {
    "policies": set(),
    "routing": {"policies"},
    "gateway": {"policies", "routing"},
    "local_backend": set(),
}
# Third-party imports that belong to one package only (STYLE.md, "Layers").
CONFINED = {
    "torch": {"local_backend"},
    "aiohttp": {"gateway", "local_backend"},
    "redis": {"gateway"},
}


def imported_top_levels(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def source_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_packages_below_it(package: str) -> None:
    violations = []
    for path in source_files(package):
        for name in imported_top_levels(path):
            if name in PACKAGES and name != package and name not in ALLOWED[package]:
                violations.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not violations, "\n".join(violations)


@pytest.mark.parametrize("library", sorted(CONFINED))
def test_library_stays_in_its_package(library: str) -> None:
    violations = []
    for package in PACKAGES:
        if package in CONFINED[library]:
            continue
        for path in source_files(package):
            if library in imported_top_levels(path):
                violations.append(f"{path.relative_to(ROOT)} imports {library}")
    assert not violations, "\n".join(violations)


def test_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from gateway.app import create_app\nimport torch\n")
    assert {"gateway", "torch"} <= imported_top_levels(bad)


def module_name(path: Path, root: Path = ROOT) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports (a `from a.b import c` may name module a.b.c);
    imports under `TYPE_CHECKING` count: a cycle for the type checker is one for the
    reader."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found & known


def import_cycles(paths: list[Path], root: Path = ROOT) -> list[list[str]]:
    """Every cycle of module imports among `paths`, each once (as found from its
    alphabetically first module)."""
    names = {module_name(p, root): p for p in paths}
    graph = {name: imported_modules(path, set(names)) - {name}
             for name, path in names.items()}
    cycles: list[list[str]] = []
    seen: set[frozenset[str]] = set()

    def visit(start: str, node: str, trail: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt == start:
                key = frozenset(trail)
                if key not in seen:
                    seen.add(key)
                    cycles.append([*trail, start])
            elif nxt > start and nxt not in trail:
                visit(start, nxt, [*trail, nxt])

    for name in sorted(graph):
        visit(name, name, [name])
    return cycles


def test_no_module_imports_itself_through_others() -> None:
    paths = [p for package in PACKAGES for p in source_files(package)]
    cycles = import_cycles(paths)
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_cycle_check_sees_a_cycle_even_under_type_checking(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.b import thing\n")
    (package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import x\n")
    (package / "c.py").write_text("import pkg.a\n")
    cycles = import_cycles(sorted(package.glob("*.py")), tmp_path)
    assert cycles == [["pkg.a", "pkg.b", "pkg.a"]]


def test_floors_hold() -> None:
    """The import-linter contracts in pyproject.toml: gateway's floors (each imports only
    the floors below it; siblings on a floor independent), local_backend's, the projects'."""
    linter = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(linter), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
