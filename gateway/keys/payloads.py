"""What the admin API accepts, as frozen models that refuse unknown fields, and the
checks against the running policy: every refusal is a 400 naming the field.

    POST  /admin/keys             CreateKey
    PATCH /admin/keys/{id}        UpdateKey (fields left out stay as they are; null clears)
    POST  /admin/keys/{id}/rotate RotateKey
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.core.errors import BadRequest
from gateway.limits.ledger import usd_to_micros
from policies.load import Policy

Text = Annotated[str, Field(max_length=200)]
Glob = Annotated[str, Field(min_length=1, max_length=200)]
Scope = Literal["admin:read", "admin:write"]
MAX_GRACE_S = 30 * 86_400.0


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


M = TypeVar("M", bound=_Model)


class LimitsIn(_Model):
    requests_per_minute: Annotated[int, Field(gt=0)] | None = None
    tokens_per_minute: Annotated[int, Field(gt=0)] | None = None


Usd = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class BudgetIn(_Model):
    usd_per_day: Usd | None = None
    usd_per_month: Usd | None = None
    usd_total: Usd | None = None


# An expiry: ISO 8601 (`2027-01-31T00:00:00Z`) or epoch seconds.
Expiry = datetime | Annotated[float, Field(gt=0, allow_inf_nan=False)]


class UpdateKey(_Model):
    name: Text | None = None
    labels: Annotated[list[Annotated[str, Field(min_length=1, max_length=100)]],
                      Field(max_length=50)] | None = None
    allow: Annotated[list[Glob], Field(max_length=100)] | None = None
    allow_targets: Annotated[list[Glob], Field(max_length=100)] | None = None
    limits: LimitsIn | None = None
    budget: BudgetIn | None = None
    expires_at: Expiry | None = None
    scopes: list[Scope] | None = None


class CreateKey(UpdateKey):
    tenant: Annotated[str, Field(min_length=1, max_length=200)]


class RotateKey(_Model):
    grace_s: Annotated[float, Field(ge=0, le=MAX_GRACE_S, allow_inf_nan=False)] = 0.0
    """Seconds the replaced key keeps working (0: it stops at once)."""


def parse(model: type[M], raw: bytes) -> M:
    """The body as `model`, or a 400 naming the first field at fault."""
    try:
        data = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"The body is not valid JSON: {exc}.", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise BadRequest("The body must be a JSON object.", code="invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]
                         if not (isinstance(part, str) and part in ("datetime", "float")
                                 and len(error["loc"]) > 1))
        message = ("unknown field" if error["type"] == "extra_forbidden"
                   else error["msg"].removeprefix("Value error, "))
        raise BadRequest(f"`{field}`: {message}.", param=field,
                         code="invalid_field") from exc


def changes(update: UpdateKey, policy: Policy, tenant: str, now: float) -> dict[str, Any]:
    """The `KeyRecord` fields an update (or a creation) sets, checked against the policy."""
    given = update.model_fields_set
    out: dict[str, Any] = {}
    if "name" in given:
        out["name"] = update.name or ""
    if "labels" in given:
        out["labels"] = tuple(dict.fromkeys(update.labels or ()))
    if "scopes" in given:
        out["scopes"] = tuple(sorted(set(update.scopes or ())))
    access = policy.access_of(tenant)
    if "allow" in given:
        out["allow"] = _within(update.allow, access.routes, "allow", tenant)
    if "allow_targets" in given:
        out["allow_targets"] = _within(update.allow_targets, access.targets, "allow_targets",
                                       tenant)
    if "limits" in given:
        limits = update.limits or LimitsIn()
        out["requests_per_minute"] = limits.requests_per_minute
        out["tokens_per_minute"] = limits.tokens_per_minute
    if "budget" in given:
        budget = update.budget or BudgetIn()
        out["budget_day_micros"] = usd_to_micros(budget.usd_per_day)
        out["budget_month_micros"] = usd_to_micros(budget.usd_per_month)
        out["budget_total_micros"] = usd_to_micros(budget.usd_total)
    if "expires_at" in given:
        out["expires_at"] = _expiry(update.expires_at, now)
    return out


def check_tenant(policy: Policy, tenant: str) -> None:
    if tenant not in policy.file.tenants:
        raise BadRequest(f"`tenant`: no tenant {tenant!r} in the policy.", param="tenant",
                         code="invalid_field")


def _within(globs: list[str] | None, usable: frozenset[str], field: str,
            tenant: str) -> tuple[str, ...] | None:
    """A key's globs, each matching something its tenant may use (a key narrows its
    tenant's access; at request time both must allow the name)."""
    if globs is None:
        return None
    for i, glob in enumerate(globs):
        if not any(fnmatchcase(name, glob) for name in usable):
            raise BadRequest(f"`{field}[{i}]`: {glob!r} names nothing tenant {tenant!r} may use.",
                             param=f"{field}[{i}]", code="invalid_field")
    return tuple(globs)


def _expiry(value: datetime | float | None, now: float) -> float | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.timestamp()
    if not math.isfinite(value) or value <= now:
        raise BadRequest("`expires_at`: the expiry is in the past.", param="expires_at",
                         code="invalid_field")
    return value
