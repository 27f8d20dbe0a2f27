"""YAML policy file → runtime `Policy`.

Phase one composes the YAML (keeping every value's line and column), resolves
`${VAR}` references and validates the file models (`schema.py`); phase two runs
the cross-field checks (`checks.py`) and resolves what the gateway needs at
request time into plain lookups, once, so the hot path never walks the file
models. Every problem found is reported together in one `PolicyError`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from policies.access import Access, AccessTable
from policies.checks import check
from policies.errors import PolicyError, PolicyIssue
from policies.hints import did_you_mean, field_names_at, literal_values_at
from policies.locate import LocatedDocument, Place, render_path
from policies.schema import Backend, ModelSpec, PolicyFile, Route

__all__ = ["Access", "ModelTarget", "Policy", "PolicyError", "PolicyIssue", "build", "load",
           "loads", "parse"]


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
    access: AccessTable = field(compare=False)  # derived from `file`
    warnings: tuple[PolicyIssue, ...] = field(default=())

    def access_of(self, tenant: str, key_hash: str | None = None) -> Access:
        return self.access.of(tenant, key_hash)

    def usable(self, requested: str, tenant: str, key_hash: str | None = None) -> str | None:
        """`resolve_model` for a caller: None also when its access does not allow the
        name (to it, the model does not exist)."""
        if not self.access.of(tenant, key_hash).allows(requested):
            return None
        return self.resolve_model(requested, tenant)

    def resolve_model(self, requested: str, tenant: str | None = None) -> str | None:
        """The route name or target key a client's `model` names, or None.

        A tenant's `routes` override sends its requests for one route to another
        (premium tenants asking for `chat` are served by `chat-fast`)."""
        if tenant is not None:
            spec = self.file.tenants.get(tenant)
            if spec is not None and requested in spec.routes:
                requested = spec.routes[requested]
        if requested in self.routes or requested in self.targets:
            return requested
        return None


def _issue_from_pydantic(error: Any, document: LocatedDocument) -> PolicyIssue:
    loc: tuple[str | int, ...] = tuple(error["loc"])
    kind = error["type"]
    hint = None
    if kind == "extra_forbidden":
        place = document.place(loc, at_key=True)
        message = f"unknown key `{loc[-1]}`"
        hint = did_you_mean(str(loc[-1]), field_names_at(PolicyFile, loc[:-1]))
    elif kind == "missing":
        place = document.place(loc, missing=True)
        message = f"`{loc[-1]}` is required"
    else:
        place = document.place(loc)
        message = error["msg"].removeprefix("Value error, ")
        if kind == "literal_error" and isinstance(error.get("input"), str):
            # Only enum values are echoed back: they are never secrets.
            hint = did_you_mean(error["input"], literal_values_at(PolicyFile, loc))
    return PolicyIssue(message, document.source, place.line, place.column, place.field_path,
                       hint)


def _parse(text: str, source: str, environ: Mapping[str, str]
           ) -> tuple[PolicyFile, LocatedDocument]:
    document, issues = LocatedDocument.compose(text, source=source, environ=environ)
    if document is None:
        raise PolicyError(issues=issues)
    data = document.data()
    if not isinstance(data, dict):
        raise PolicyError(issues=[*issues, PolicyIssue(
            "the policy must be a YAML mapping (`version: 1`, `backends: …`)", source,
            document.root.start_mark.line + 1, document.root.start_mark.column + 1)])
    try:
        policy_file = PolicyFile.model_validate(data)
    except ValidationError as exc:
        # one mistake, one error: a value the environment failed to supply (an unset
        # variable) is not also reported as the wrong type
        reported = {(issue.line, issue.column) for issue in issues}
        issues += [issue for issue in (_issue_from_pydantic(error, document)
                                       for error in exc.errors())
                   if (issue.line, issue.column) not in reported]
    if issues:
        raise PolicyError(issues=sorted(issues, key=_file_order))
    return policy_file, document


def _file_order(issue: PolicyIssue) -> tuple[int, int]:
    return (issue.line or 0, issue.column or 0)


def parse(text: str, *, source: str = "<policy>",
          environ: Mapping[str, str] | None = None) -> PolicyFile:
    """Validate policy YAML text into file models (no cross-field checks)."""
    return _parse(text, source, os.environ if environ is None else environ)[0]


def build(policy_file: PolicyFile, *, source: str = "<policy>", digest: str = "",
          document: LocatedDocument | None = None) -> Policy:
    """Cross-field checks and lookups: file models → runtime `Policy`."""

    def locate(path: Sequence[str | int], *, at_key: bool = False) -> Place:
        if document is None:
            return Place(None, None, render_path(path))
        return document.place(path, at_key=at_key)

    found = check(policy_file, locate, source)
    if found.errors:
        raise PolicyError(issues=sorted(found.errors, key=_file_order))

    targets: dict[str, ModelTarget] = {}
    for backend_name, backend in policy_file.backends.items():
        if not backend.enabled:
            continue
        for model_name, spec in backend.models.items():
            key = f"{backend_name}/{model_name}"
            targets[key] = ModelTarget(
                key=key, backend_name=backend_name, model_name=model_name,
                upstream_name=spec.upstream_name or model_name, backend=backend, spec=spec,
            )

    routes: dict[str, Route] = {}
    for route_name, route in policy_file.routes.items():
        live = [target for target in route.targets if target in targets]
        if live:  # a route whose every target is disabled is not served (a warning says so)
            routes[route_name] = route.model_copy(update={"targets": live})

    tenant_by_key_hash = {key_hash: tenant_name
                          for tenant_name, tenant in policy_file.tenants.items()
                          for key_hash in tenant.api_keys}
    return Policy(
        file=policy_file, source=source, version_hash=digest, targets=targets, routes=routes,
        tenant_by_key_hash=tenant_by_key_hash,
        admin_key_hashes=frozenset(policy_file.auth.admin_keys),
        access=AccessTable(policy_file, routes, targets),
        warnings=tuple(sorted(found.warnings, key=_file_order)),
    )


def loads(text: str, *, source: str = "<policy>",
          environ: Mapping[str, str] | None = None) -> Policy:
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    policy_file, document = _parse(text, source, os.environ if environ is None else environ)
    return build(policy_file, source=source, digest=digest, document=document)


def load(path: str | Path, *, environ: Mapping[str, str] | None = None) -> Policy:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError(f"cannot read policy file: {exc.strerror}", source=str(path)) from exc
    except UnicodeDecodeError as exc:
        raise PolicyError(f"not UTF-8 text (byte {exc.start})", source=str(path)) from exc
    return loads(text, source=str(path), environ=environ)
