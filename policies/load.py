"""YAML policy file → runtime `Policy`.

Phase one parses and validates the file models (`schema.py`); phase two resolves
what the gateway needs at request time into plain lookups, once, so the hot path
never walks the file models.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from policies.schema import Backend, ModelSpec, PolicyFile, Route

_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:-|:\+)([^}]*))?\}")


class PolicyError(Exception):
    """A policy file that cannot be used; `str()` names file, line and field."""

    def __init__(self, message: str, *, source: str = "<policy>", line: int | None = None,
                 column: int | None = None, field_path: str | None = None,
                 hint: str | None = None) -> None:
        self.message = message
        self.source = source
        self.line = line
        self.column = column
        self.field_path = field_path
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        text = f"{where}: "
        if self.field_path:
            text += f"{self.field_path}: "
        text += self.message
        if self.hint:
            text += f" (hint: {self.hint})"
        return text


@dataclass(frozen=True, slots=True)
class ModelTarget:
    """One model on one backend: what a route target `backend/model` resolves to."""

    key: str  # "backend/model"
    backend_name: str
    model_name: str
    upstream_name: str  # the `model` value sent to the backend
    backend: Backend
    spec: ModelSpec


@dataclass(frozen=True)
class Policy:
    file: PolicyFile
    source: str
    version_hash: str  # sha256 of the file bytes, first 12 hex digits
    targets: Mapping[str, ModelTarget]  # enabled backends only, by "backend/model"
    routes: Mapping[str, Route]  # targets on disabled backends removed
    tenant_by_key_hash: Mapping[str, str]  # "sha256:…" → tenant name
    admin_key_hashes: frozenset[str]
    warnings: tuple[str, ...] = field(default=())

    def resolve_model(self, requested: str) -> str | None:
        """The route name or target key a client's `model` names, or None."""
        if requested in self.routes or requested in self.targets:
            return requested
        return None


def interpolate(text: str, environ: Mapping[str, str], source: str = "<policy>") -> str:
    """Replace `${VAR}`, `${VAR:-default}` and `${VAR:+word}` (shell semantics)."""

    def substitute(match: re.Match[str]) -> str:
        name, operator, argument = match.group(1), match.group(2), match.group(3)
        value = environ.get(name)
        if operator == ":-":
            return value if value else (argument or "")
        if operator == ":+":
            return (argument or "") if value else ""
        if value is None:
            line = text.count("\n", 0, match.start()) + 1
            raise PolicyError(
                f"environment variable {name} is not set",
                source=source, line=line,
                hint=f"set {name}, or write ${{{name}:-default}}",
            )
        return value

    return _ENV_REFERENCE.sub(substitute, text)


def parse(text: str, *, source: str = "<policy>",
          environ: Mapping[str, str] | None = None) -> PolicyFile:
    """Validate policy YAML text into file models (no cross-field checks)."""
    resolved = interpolate(text, os.environ if environ is None else environ, source)
    try:
        data: Any = yaml.safe_load(resolved)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise PolicyError(
            f"not valid YAML: {getattr(exc, 'problem', exc)}", source=source,
            line=mark.line + 1 if mark else None, column=mark.column + 1 if mark else None,
        ) from exc
    if not isinstance(data, dict):
        raise PolicyError("the policy must be a YAML mapping", source=source)
    try:
        return PolicyFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(part) for part in first["loc"])
        raise PolicyError(first["msg"], source=source, field_path=path) from exc


def build(policy_file: PolicyFile, *, source: str = "<policy>", digest: str = "") -> Policy:
    """Cross-field checks and lookups: file models → runtime `Policy`."""
    targets: dict[str, ModelTarget] = {}
    all_targets: set[str] = set()
    for backend_name, backend in policy_file.backends.items():
        for model_name, spec in backend.models.items():
            key = f"{backend_name}/{model_name}"
            all_targets.add(key)
            if backend.enabled:
                targets[key] = ModelTarget(
                    key=key, backend_name=backend_name, model_name=model_name,
                    upstream_name=spec.upstream_name or model_name, backend=backend, spec=spec,
                )

    routes: dict[str, Route] = {}
    for route_name, route in policy_file.routes.items():
        for index, target in enumerate(route.targets):
            if target not in all_targets:
                raise PolicyError(
                    f"target {target!r} names no backend model",
                    source=source, field_path=f"routes.{route_name}.targets[{index}]",
                )
        live = [target for target in route.targets if target in targets]
        routes[route_name] = route.model_copy(update={"targets": live}) if live else route

    tenant_by_key_hash: dict[str, str] = {}
    for tenant_name, tenant in policy_file.tenants.items():
        for index, key_hash in enumerate(tenant.api_keys):
            if key_hash in tenant_by_key_hash:
                raise PolicyError(
                    f"key hash already belongs to tenant {tenant_by_key_hash[key_hash]!r}",
                    source=source, field_path=f"tenants.{tenant_name}.api_keys[{index}]",
                )
            tenant_by_key_hash[key_hash] = tenant_name

    return Policy(
        file=policy_file, source=source, version_hash=digest, targets=targets,
        routes={name: route for name, route in routes.items() if route.targets[0] in targets},
        tenant_by_key_hash=tenant_by_key_hash,
        admin_key_hashes=frozenset(policy_file.auth.admin_keys),
    )


def loads(text: str, *, source: str = "<policy>",
          environ: Mapping[str, str] | None = None) -> Policy:
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    return build(parse(text, source=source, environ=environ), source=source, digest=digest)


def load(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Policy:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read policy file: {exc.strerror}", source=str(path)) from exc
    return loads(text, source=str(path), environ=environ)
