"""Why a `model` a client asked for is not served, in words it can act on.

A name the running policy does not serve a caller is either unknown (a typo: the closest
route or model is suggested) or known but switched off: a route whose every target,
or a `backend/model` whose backend, is disabled (e.g. `enabled: ${OPENAI_API_KEY:+true}`
with the key unset). The two call for different fixes, so they read differently.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.access import Access
from policies.hints import did_you_mean
from policies.load import Policy


@dataclass(frozen=True, slots=True)
class Unserved:
    message: str
    disabled: bool  # the name exists in the policy, but nothing enabled serves it


def unserved_model(policy: Policy, requested: str, access: Access) -> Unserved:
    """What to tell a client whose `model` the policy does not serve it. A name its
    `access` does not admit does not exist, to it: neither that it is disabled nor
    names it may not use are told."""
    file = policy.file
    route = file.routes.get(requested)
    if route is not None and access.would_allow(requested, target=False):
        backends = sorted({target.split("/", 1)[0] for target in route.targets})
        return Unserved(
            f"The model '{requested}' is a route of this gateway, but every backend that "
            f"serves it is disabled ({', '.join(backends)}).", disabled=True)
    backend_name, _, model_name = requested.partition("/")
    backend = file.backends.get(backend_name)
    if backend is not None and model_name in backend.models and not backend.enabled and (
            access.would_allow(requested, target=True)):
        return Unserved(
            f"The model '{requested}' exists, but its backend '{backend_name}' is disabled.",
            disabled=True)
    hint = did_you_mean(requested, [*access.routes, *access.targets])
    return Unserved(
        f"The model '{requested}' does not exist" + (f"; {hint}" if hint else ".")
        + " GET /v1/models lists the routes and models you can use.", disabled=False)
