"""File models: a one-to-one mirror of the policy YAML.

Every model is frozen and forbids unknown keys, so a typo in a policy file is an
error, never a silently ignored setting. Cross-field checks (a route target that
names no backend model, duplicate key hashes, ...) live in `load.py`, which turns
these file models into the runtime `Policy`. The backend models live in
`backend_schema.py`, the stores' (limits, shared state) in `store_schema.py` and the
shared base in `file_model.py`; all are re-exported here.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    WithJsonSchema,
    model_validator,
)

from policies.backend_schema import Backend as Backend
from policies.backend_schema import Capabilities as Capabilities
from policies.backend_schema import LatencyPriors as LatencyPriors
from policies.backend_schema import LaunchSpec as LaunchSpec
from policies.backend_schema import ModelSpec as ModelSpec
from policies.backend_schema import Timeouts as Timeouts
from policies.bands import BATCH_BAND, TenantPriority
from policies.bands import Priority as Priority
from policies.batch_schema import Batches as Batches
from policies.file_model import KEY_HASH_PATTERN as KEY_HASH_PATTERN
from policies.file_model import TARGET_PATTERN as TARGET_PATTERN
from policies.file_model import FileModel as FileModel
from policies.file_model import KeyHash as KeyHash
from policies.file_model import NonNegativeFloat as NonNegativeFloat
from policies.file_model import PositiveFloat as PositiveFloat
from policies.file_model import PositiveInt as PositiveInt
from policies.file_model import Target as Target
from policies.fleet_schema import PrefixCache
from policies.keys_schema import KeyService as KeyService
from policies.resilience import Resilience
from policies.store_schema import STORE_URL_PATTERN as STORE_URL_PATTERN
from policies.store_schema import LimitStore as LimitStore
from policies.store_schema import ResponsesState as ResponsesState
from policies.store_schema import SharedState as SharedState
from policies.store_schema import StoreLatency as StoreLatency


class LatencyBudget(FileModel):
    ttft_ms: PositiveFloat | None = None
    """Longest acceptable time to the first token, in ms; a request header may tighten it."""
    total_ms: PositiveFloat | None = None
    """Longest acceptable time for the whole response, in ms; a request header may tighten it."""


class Route(FileModel):
    targets: list[Target] = Field(min_length=1)
    """`backend/model` names that may serve this route: the order `ordered` keeps, and that
    breaks ties under `cheapest` and `fastest`."""
    objective: Literal["cheapest", "fastest", "ordered"] = "cheapest"
    """How candidates are ordered: `cheapest` (amortised cost), `fastest` (predicted time) or
    `ordered` (as `targets` lists them: the first that passes the rules and budgets leads)."""
    latency_budget: LatencyBudget = LatencyBudget()
    """The time the route promises; candidates predicted to miss it are left out."""
    on_budget_miss: Literal["fastest", "reject"] = "fastest"
    """When no candidate fits the budget: `fastest` serves from the fastest anyway, `reject` answers
    503."""
    expected_output_tokens: PositiveInt = 256
    """Completion length assumed for cost, limits and prediction until the route's running mean
    exists."""
    limits: Limits | None = None
    """Requests and tokens per minute per tenant on this route, inside the tenant's own limits."""
    cache: RouteCache | None = None
    """Keep whole answers on this route and serve them again for identical requests; none: never
    cached."""
    spread: Spread | None = None
    """Share the load among candidates as good as the best (`within` of its cost or predicted
    time); none: the best always leads."""
    weights: dict[Target, PositiveFloat] = {}
    """Share of each target among equals under `spread`, by `backend/model` (default 1)."""
    prefix_cache: PrefixCache | None = None
    """`shared`: requests on this route send no per-tenant cache salt to dedicated
    backends, so tenants warm one another's prefix cache; unset: the tenant's setting."""

    @model_validator(mode="after")
    def _weights_name_targets(self) -> Route:
        unknown = sorted(set(self.weights) - set(self.targets))
        if unknown:
            raise ValueError(f"`weights` names {', '.join(unknown)}, not among `targets`")
        if self.spread is not None and self.objective == "ordered":
            raise ValueError("`spread` shares the load among targets as cheap or as fast as "
                             "the best; `objective: ordered` has no such equals (use "
                             "`cheapest` or `fastest` with `spread`)")
        return self


def _not_the_batch_band(value: object) -> object:
    if value == BATCH_BAND:
        raise ValueError("`batch` is the Batch API's own band, below `low`, and no tenant can "
                         "be given it; use one of high, normal, low")
    return value


# A tenant's band: `batch` is refused by name, not with a bare "not one of" (policies/bands.py).
TenantBand = Annotated[TenantPriority, BeforeValidator(_not_the_batch_band)]


def _percent(value: object) -> object:
    """`5%` as YAML writes it (a string), or a plain number of percent."""
    if isinstance(value, str) and value.strip().endswith("%"):
        return value.strip()[:-1]
    return value


class Spread(FileModel):
    """Candidates whose cost (`cheapest`) or predicted total (`fastest`) is within `within` of
    the best share the load: two drawn by weight, the less busy one leads."""

    within: Annotated[float, BeforeValidator(_percent), Field(ge=0, le=100), WithJsonSchema({
        "anyOf": [{"type": "number", "minimum": 0, "maximum": 100},
                  {"type": "string", "pattern": r"^\d+(\.\d+)?%$"}]})] = 5.0
    """Tolerance, in percent (`5%` or 5)."""


class RouteCache(FileModel):
    """Whole answers kept and served again for identical requests."""

    ttl_s: PositiveFloat = 300.0
    """Seconds an answer is kept."""
    max_entry_bytes: PositiveInt = 256 * 1024
    """A larger answer is not kept."""
    scope: Literal["tenant", "global"] = "tenant"
    """`tenant`: each tenant reads only its own answers; `global`: one tenant may read another's."""
    nondeterministic: bool = False
    """Also keep answers sampled with temperature > 0."""
    store_content: bool = False
    """Keep answers although `compliance.record_content` is off (the gateway then holds prompts and
    completions, hashed and whole, for `ttl_s`)."""

    def may_keep(self, record_content: bool) -> bool:
        """Whether answers may be kept at all: only with content recording on (the policy's
        `compliance.record_content`) or this route opting in (`store_content`)."""
        return record_content or self.store_content


PiiCategory = Literal["email", "phone", "credit_card", "iban", "us_ssn", "ip_address"]


class PiiPolicy(FileModel):
    detect: list[PiiCategory] = []
    """Categories of personal data to look for in prompts."""
    action: Literal["local_only", "redact", "block"] = "local_only"
    """What a request carrying any of them gets: `local_only` (dedicated backends only), `redact`
    (placeholders sent upstream) or `block` (403)."""


# A tenant tag, compared without regard to case (`EU` and `eu` are one tag): kept folded.
Tag = Annotated[str, AfterValidator(str.casefold)]


class RuleWhen(FileModel):
    """When a rule applies: every non-empty condition must hold."""

    tenant_tags: list[Tag] = []
    """The rule applies to tenants having any of these tags (case does not matter)."""
    tenants: list[str] = []
    """The rule applies to these tenants."""
    # Scoped to routes, a rule also holds for each of their targets asked for directly
    # by its `backend/model` name: what binds `chat` binds every target of `chat`,
    # however the request names it.
    routes: list[str] = []
    """The rule applies to requests for these routes, and to their targets asked for directly."""


class RuleRequire(FileModel):
    regions: list[str] = []
    """Backends must be in a region matching one of these glob patterns (`eu-*`)."""
    deployment: Literal["shared", "dedicated"] | None = None
    """Backends must have this deployment (`shared` or `dedicated`)."""
    data_retention: Literal["zero", "standard"] | None = None
    """Backends must declare this data retention (`zero` or `standard`)."""


class ComplianceRule(FileModel):
    name: str
    """Named in exclusion reasons, explain output and spans."""
    when: RuleWhen = RuleWhen()
    """Which requests the rule applies to (every condition given must hold); empty: all."""
    require: RuleRequire
    """What a backend must satisfy to serve those requests."""


class Compliance(FileModel):
    pii: PiiPolicy = PiiPolicy()
    """Personal-data detection and what it does to routing."""
    rules: list[ComplianceRule] = []
    """Requirements on backends for some tenants or routes (fail-closed)."""
    record_content: bool = False
    """Record prompt and completion text on traced root spans (never in logs)."""


class Limits(FileModel):
    requests_per_minute: PositiveInt | None = None
    """Requests admitted per minute (a sliding-window counter: exactly this many in a burst
    from idle, at most twice as many in any 60 s; docs/limits.md); none: unlimited."""
    tokens_per_minute: PositiveInt | None = None
    """Prompt plus expected completion tokens admitted per minute, counted as requests
    are; none: unlimited."""


class Budget(FileModel):
    usd_per_day: NonNegativeFloat | None = None
    """Spend allowed per UTC day in USD; past it requests get 429 `budget_exceeded`."""
    usd_per_month: NonNegativeFloat | None = None
    """Spend allowed per UTC month in USD."""




ModelGlob = Annotated[str, Field(min_length=1)]  # fnmatch pattern: `chat*`, `shared/*`


class KeyAccess(FileModel):
    """One API key's access, in place of its tenant's (a field left out: the tenant's)."""

    allow: list[ModelGlob] | None = None
    """Route names (globs) this key may ask for, in place of its tenant's."""
    allow_targets: list[ModelGlob] | None = None
    """`backend/model` names (globs) this key may ask for directly, in place of its tenant's."""


class Tenant(FileModel):
    api_keys: list[KeyHash] = []
    """SHA-256 hashes of the tenant's keys (`sha256:<64 hex>`, from `routegate keys new`), never the
    keys."""
    # What its callers may ask for by name; anything else is a 404 `model_not_found`, and
    # `/v1/models` lists only what they may use. None: `defaults.allow` /
    # `defaults.allow_targets`. `allow` matches route names; `allow_targets` matches
    # `backend/model` names asked for directly, past every route.
    allow: list[ModelGlob] | None = None
    """Route names (globs: `chat*`) its callers may ask for; anything else is a 404 and is left out
    of /v1/models. None: `defaults.allow`."""
    allow_targets: list[ModelGlob] | None = None
    """`backend/model` names (globs) its callers may ask for directly, past every route. None:
    `defaults.allow_targets`."""
    key_access: dict[KeyHash, KeyAccess] = {}
    """Access of single keys (by hash, one of `api_keys`), overriding the tenant's."""
    tags: list[Tag] = []
    """Labels compliance rules match (`eu`, `premium`; case does not matter)."""
    priority: TenantBand = "normal"
    """Queue band: `high` is served first, `low` last of the tenants' bands (only batch lines,
    in the `batch` band of their own, come after it)."""
    limits: Limits | None = None
    """Requests and tokens per minute for the tenant; none: `defaults.limits`."""
    key_limits: Limits | None = None
    """Requests and tokens per minute for each of its keys, inside the tenant's limits."""
    budget: Budget = Budget()
    """Daily and monthly spend limits."""
    queue_weight: PositiveFloat = 1.0
    """Share of queue slots against other tenants of the same priority (2: twice the share)."""
    routes: dict[str, str] = {}
    """Route overrides: the route a client asks for → the route that serves this tenant (`chat:
    chat-fast`)."""
    prefix_cache: PrefixCache = "tenant"
    """`tenant`: every request to a dedicated backend carries this tenant's own cache salt
    (`cache_salt`), so its prompts never warm another tenant's KV cache; `shared` opts in
    to sharing."""


class AnonymousAccess(FileModel):
    enabled: bool = False
    """Serve callers without a known key as the anonymous tenant."""
    tenant: str = "anonymous"
    """The tenant name anonymous callers are served as (limits, budgets, rules)."""
    loopback_only: bool = True
    """Only callers on the gateway's own machine may be anonymous."""
    reject_unknown_keys: bool = False
    """A caller presenting a key the policy does not know gets 401 instead of anonymous service."""


class Auth(FileModel):
    anonymous: AnonymousAccess = AnonymousAccess()
    """Access without a known API key."""
    admin_keys: list[KeyHash] = []
    """SHA-256 hashes of the keys that may use `/admin/*` (and the dashboard's data)."""


class Drain(FileModel):
    """What SIGTERM does: `/readyz` answers 503 at once; new connections are still
    served for `announce_s` (load balancers notice the 503 and stop sending); then the
    listener closes and requests in flight get up to `timeout_s` to finish. A stream
    still running then ends with an error event. A second SIGTERM cuts it short."""

    announce_s: NonNegativeFloat = 5.0
    """Seconds new connections are still served after SIGTERM while `/readyz` says 503."""
    timeout_s: NonNegativeFloat = 30.0
    """Seconds requests in flight get to finish once the listener has closed."""


class ServerSettings(FileModel):
    max_body_bytes: PositiveInt = 4 * 1024 * 1024
    """Largest request body accepted; larger ones get 413."""
    drain: Drain = Drain()
    """What SIGTERM does before the process exits."""
    metrics_auth: bool | None = None
    """`GET /metrics` answers only to a key listed in `auth.admin_keys`. Unset: on as soon as
    `auth.admin_keys` lists a key (the series name tenants, routes and backends); `false`
    opens it to anyone who can reach the port."""
    max_upstream_body_bytes: PositiveInt = 32 * 1024 * 1024
    """Largest non-streamed reply a backend may send; past it the attempt fails (the next
    candidate serves, or a 502 names this setting), never buffered whole."""
    max_event_bytes: PositiveInt = 1024 * 1024
    """Largest single event of a backend's stream; past it the stream ends with an error
    event naming this setting."""
    header_read_timeout_s: PositiveFloat = 10.0
    """Seconds until a request's headers are complete, from the moment the connection opens
    (for its first request) or from the next request's first byte (on a kept-alive
    connection); a client slower than that, or one that sends nothing, gets 408 and the
    connection closes."""
    keep_alive_timeout_s: PositiveFloat = 75.0
    """Seconds a kept-alive connection may stay idle between two requests before the gateway
    closes it."""
    body_read_timeout_s: PositiveFloat = 30.0
    """Longest pause while a request body arrives; past it, 408 and the connection closes."""
    max_connections_per_client: PositiveInt = 1024
    """Connections one client address may hold open; more are answered 429 and closed."""
    readyz: Literal["all_routes", "any"] = "all_routes"
    """When `GET /readyz` says ready: `all_routes`, when every route has a target whose
    backend is ready, and so has every tenant among the targets its compliance rules leave
    it (a launched backend is ready once it has warmed up); `any`, as soon as one backend
    is ready."""


class Defaults(FileModel):
    limits: Limits = Limits(requests_per_minute=60, tokens_per_minute=50_000)
    """Limits of tenants that set none."""
    priority: TenantBand = "normal"
    """Queue band of tenants that set none."""
    # Access of a tenant that sets none (and of anonymous callers): every route, and no
    # target by its direct `backend/model` name (that would skip the route's rules).
    allow: list[ModelGlob] = ["*"]
    """Route names (globs) a tenant that sets none, and anonymous callers, may ask for."""
    allow_targets: list[ModelGlob] = []
    """`backend/model` names (globs) they may ask for directly (none by default: that would skip the
    route's rules)."""


class PolicyFile(FileModel):
    version: Literal[1]
    """The policy file format: 1."""
    backends: dict[str, Backend] = Field(min_length=1)
    """Where requests can run, by name."""
    routes: dict[str, Route] = {}
    """The `model` names clients ask for, and who may serve them."""
    compliance: Compliance = Compliance()
    """Personal-data handling and rules on where requests may run."""
    tenants: dict[str, Tenant] = {}
    """Callers, by name: keys, tags, priority, limits, budgets."""
    defaults: Defaults = Defaults()
    """What tenants without their own settings get."""
    auth: Auth = Auth()
    """Anonymous access and admin keys."""
    server: ServerSettings = ServerSettings()
    """Request size and shutdown behaviour."""
    limits: LimitStore = LimitStore()
    """Where rate limits and spend are counted."""
    responses: ResponsesState = ResponsesState()
    """Where responses are kept for `GET /v1/responses/{id}` and `previous_response_id`."""
    response_cache: SharedState = SharedState()
    """Where the answers of routes with `cache:` are kept."""
    resilience: Resilience = Resilience()
    """Outlier ejection of failing targets, and retries of the same target."""
    keys: KeyService = KeyService()
    """Keys issued, limited, rotated and revoked through `/admin/keys` (docs/keys.md)."""
    batches: Batches = Batches()
    """The Batch API: its files, state store, and spare-capacity and spill thresholds."""
