"""What the deployment files promise, read back as plain data for the deploy tests.

The commands and environment the images run are checked against the real CLI parsers,
and the variables they set against the names the code reads (found in its source), so
a renamed flag or variable fails here rather than in a cluster.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gateway.cli import build_parser
from local_backend.__main__ import parse_args as parse_local_backend_args

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
_ENV_NAME = re.compile(r'"((?:ROUTEGATE|OTEL)_[A-Z_]+)"')
_POLICY_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")
DEMO_KEY, DEMO_ADMIN_KEY = "sk-routegate-demo", "sk-routegate-demo-admin"


def k8s_documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, document) for path in sorted(K8S.glob("*.yaml"))
            for document in yaml.safe_load_all(path.read_text()) if document]


def of_kind(kind: str) -> Iterator[dict[str, Any]]:
    return (document for _, document in k8s_documents() if document["kind"] == kind)


def named(kind: str, name: str) -> dict[str, Any]:
    found = [document for document in of_kind(kind) if document["metadata"]["name"] == name]
    assert found, f"no {kind} named {name!r} in deploy/k8s"
    return found[0]


def pod_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("Deployment", "StatefulSet"):
        for document in of_kind(kind):
            yield document["metadata"]["name"], document["spec"]["template"]["spec"]


def env_read_by(package: str) -> set[str]:
    """Every `ROUTEGATE_*` / `OTEL_*` name the package's source reads."""
    names: set[str] = set()
    for source in (ROOT / package).rglob("*.py"):
        names.update(_ENV_NAME.findall(source.read_text()))
    return names


def policy_variables(policy_text: str) -> set[str]:
    return set(_POLICY_VARIABLE.findall(policy_text))


def parse_gateway_command(argv: list[str]) -> argparse.Namespace:
    """`routegate ARGS` as the gateway image runs it (SystemExit if the CLI refuses)."""
    return build_parser().parse_args(argv)


def parse_local_backend_command(argv: list[str]) -> argparse.Namespace:
    return parse_local_backend_args(argv)


def dockerfile_stages() -> dict[str, dict[str, Any]]:
    """ENTRYPOINT, CMD (JSON forms) and ENV names of each stage of deploy/Dockerfile;
    a stage built `FROM` another starts with what that one set."""
    stages: dict[str, dict[str, Any]] = {}
    stage: dict[str, Any] = {}
    for line in (DEPLOY / "Dockerfile").read_text().splitlines():
        if line.startswith("FROM "):
            words = line.split()
            parent = stages.get(words[1], {})
            stage = {**parent, "ENV": list(parent.get("ENV", []))}
            stages[words[-1]] = stage
        elif line.startswith(("ENTRYPOINT ", "CMD ")):
            instruction, _, value = line.partition(" ")
            stage[instruction] = yaml.safe_load(value)
        elif line.startswith("ENV "):
            stage["ENV"] += [pair.split("=", 1)[0] for pair in line[4:].split()]
    return stages
