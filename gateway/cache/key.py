"""What the response cache may keep for a request, and under which key. Pure.

The key is a SHA-256 of the canonical request: the route the request was routed on,
then every field of the (chat) body in sorted-key JSON except those that do not change
the answer (`model` as the client spelled it, `stream`, `stream_options`, `user`,
`metadata`, ...), scoped by tenant unless the route says `scope: global`. A streamed
and a plain request for the same thing share an entry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Literal

import orjson

from policies.schema import Compliance, RouteCache

Mode = Literal["use", "refresh", "bypass"]  # read and keep | keep only | neither

REFRESH_HEADER = "x-routegate-cache-refresh"  # any value: answer afresh, keep the answer
# Fields that say who asks or how the answer is delivered, not what it is.
_NOT_IN_KEY = frozenset({"model", "stream", "stream_options", "user", "metadata", "store",
                         "service_tier", "safety_identifier", "prompt_cache_key"})
_PII_KEPT_LOCAL = ("redact", "local_only")


def mode_of(headers: Mapping[str, str], body: Mapping[str, Any], cache: RouteCache,
            compliance: Compliance, pii_found: bool) -> Mode:
    """`use` unless the client, the sampling or the policy rules the cache out."""
    if pii_found and compliance.pii.action in _PII_KEPT_LOCAL:
        return "bypass"  # an answer about personal data is not kept, not even hashed
    if not cache.may_keep(compliance.record_content):
        return "bypass"  # the policy keeps no content unless the route opts in
    if not cache.nondeterministic and not _deterministic(body):
        return "bypass"
    control = headers.get("Cache-Control", "").lower()
    if "no-store" in control:
        return "bypass"
    if "no-cache" in control or REFRESH_HEADER in headers:
        return "refresh"
    return "use"


def _deterministic(body: Mapping[str, Any]) -> bool:
    """Sampled at temperature 0. No temperature means the backend's default (1 for
    OpenAI): a fresh sample each time, so not deterministic either."""
    temperature = body.get("temperature")
    return isinstance(temperature, int | float) and temperature == 0


def cache_key(route: str, body: Mapping[str, Any], path: str, tenant: str | None) -> str:
    """`tenant` None: shared by every tenant (`scope: global`)."""
    canonical = orjson.dumps({name: value for name, value in body.items()
                              if name not in _NOT_IN_KEY}, option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(canonical).hexdigest()
    scope = "*" if tenant is None else f"t:{tenant}"
    return f"routegate:cache:{{{scope}}}:{route}:{path}:{digest}"
