"""The one direction of dependency: policies ← routing ← gateway; local_backend alone."""

import ast
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
