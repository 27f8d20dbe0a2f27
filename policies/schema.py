"""File models: a one-to-one mirror of the policy YAML.

Every model is frozen and forbids unknown keys, so a typo in a policy file is an
error, never a silently ignored setting. Cross-field checks (a route target that
names no backend model, duplicate key hashes, ...) live in `load.py`, which turns
these file models into the runtime `Policy`.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)

KEY_HASH_PATTERN = re.compile(r"^sha256:[0-9a-f]{64}$")
TARGET_PATTERN = re.compile(r"^[A-Za-z0-9_.\-]+/[^/\s]+.*$")

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeFloat = Annotated[float, Field(ge=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


def _check_target(target: str) -> str:
    if not TARGET_PATTERN.match(target):
        raise ValueError(f"target {target!r} must be written as backend/model")
    return target


def _check_key_hash(key: str) -> str:
    # The value is not echoed: a plain key pasted here by mistake is a secret.
    if not KEY_HASH_PATTERN.match(key):
        raise ValueError(
            "api_keys hold sha256:<64 hex> hashes, never plain keys "
            "(make one with `routegate keys hash KEY`)"
        )
    return key


# Validated one by one, so an error names the list item (`routes.chat.targets[2]`).
# The pattern is for the JSON Schema only (editors flag what the loader refuses); the
# validator gives the error its wording.
Target = Annotated[str, AfterValidator(_check_target),
                   Field(json_schema_extra={"pattern": TARGET_PATTERN.pattern})]
KeyHash = Annotated[str, AfterValidator(_check_key_hash),
                    Field(json_schema_extra={"pattern": KEY_HASH_PATTERN.pattern})]


class FileModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LatencyPriors(FileModel):
    """Declared latency of a backend model, used until live statistics exist."""

    network_ms: NonNegativeFloat = 20.0
    ttft_ms: NonNegativeFloat | None = None  # fixed overhead before the first token
    prefill_tokens_per_s: PositiveFloat = 5000.0
    decode_tokens_per_s: PositiveFloat = 50.0


class Capabilities(FileModel):
    """What a model can do. A field left out takes its backend type's default: `openai`
    everything, `anthropic` what the translation to the Messages API carries (tools,
    vision), a `launch:` backend what it reports about itself at `/v1/models`. Routing
    sends a request only to targets that can do all it asks (`tools` in the body needs
    `tools: true`), so a model is never asked for what it would silently ignore."""

    tools: bool | None = None  # `tools` / `tool_choice` (and the legacy `functions`)
    vision: bool | None = None  # image parts in messages
    json_mode: bool | None = None  # response_format {type: json_object}
    json_schema: bool | None = None  # response_format {type: json_schema}
    logprobs: bool | None = None
    audio: bool | None = None  # audio parts in messages, or audio output
    n: PositiveInt | None = None  # the most choices one request may ask for


class ModelSpec(FileModel):
    upstream_name: str | None = None  # the name sent upstream when it differs from the key
    input_usd_per_mtok: NonNegativeFloat = 0.0
    output_usd_per_mtok: NonNegativeFloat = 0.0
    # prompt + completion; a launched backend reports its own (an explicit value wins)
    context_tokens: PositiveInt | None = None
    max_output_tokens: PositiveInt | None = None  # the most `max_tokens` it accepts
    capabilities: Capabilities = Capabilities()
    max_concurrency: PositiveInt | None = None  # a queue of its own, inside the backend's
    priors: LatencyPriors = LatencyPriors()


class Timeouts(FileModel):
    connect_s: PositiveFloat = 5.0
    first_byte_s: PositiveFloat = 60.0  # request sent → response headers
    total_s: PositiveFloat = 600.0


class LaunchSpec(FileModel):
    """Start a local_backend child process for this backend (`routegate serve` owns it)."""

    model: str = "demo"  # `demo` or a Hugging Face checkpoint directory
    args: list[str] = []
    startup_timeout_s: PositiveFloat = 120.0


class Backend(FileModel):
    type: Literal["openai", "anthropic"]
    # None only with `launch`: the gateway fills in the child's port
    url: str | None = Field(None, description=(
        "http(s)://host[:port][/path] of the backend's API. Credentials in it "
        "(user:password@) are refused: the URL is shown in logs and the admin API, so a "
        "secret goes in `api_key`, which is masked and sent as the backend's auth header."),
        json_schema_extra={"pattern": r"^(https?://|.*\$\{)"})  # editors only
    api_key: SecretStr | None = None
    ca_file: str | None = Field(None, description=(
        "PEM file of the CA certificates trusted for an https `url`, in place of the "
        "system's (a private CA); absolute, or relative to the gateway's working "
        "directory. The server's name is verified against its certificate either way."))
    deployment: Literal["shared", "dedicated"] = "shared"
    region: str | None = None
    data_retention: Literal["zero", "standard"] | None = None
    gpu_hour_usd: NonNegativeFloat | None = None
    max_concurrency: PositiveInt | None = None
    max_connections: PositiveInt = 256
    timeouts: Timeouts = Timeouts()
    launch: LaunchSpec | None = None
    enabled: bool = True
    # how `POST /v1/responses` reaches it: translated to chat completions, or sent to its
    # own `/responses` as the client wrote it (OpenAI)
    responses: Literal["translate", "native"] = "translate"
    models: dict[str, ModelSpec] = Field(min_length=1)

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        if url is not None and "@" in urlsplit(url).netloc:
            # The value is not echoed: it holds a secret.
            raise ValueError("must not carry credentials (user:password@); put the key in "
                             "`api_key`, which is kept secret")
        return url.rstrip("/") if url else url

    @field_validator("ca_file")
    @classmethod
    def _ca_file_exists(cls, ca_file: str | None) -> str | None:
        if ca_file is not None and not Path(ca_file).is_file():
            raise ValueError(f"no such file: {ca_file}")
        return ca_file

    @field_validator("enabled", mode="before")
    @classmethod
    def _empty_means_disabled(cls, value: object) -> object:
        # `enabled: ${OPENAI_API_KEY:+true}` interpolates to "" when the key is unset.
        return False if value in ("", None) else value

    @model_validator(mode="after")
    def _url_or_launch(self) -> Backend:
        if self.url is None and self.launch is None:
            raise ValueError("a backend needs `url`, or `launch` to start a local_backend")
        if self.responses == "native" and self.type != "openai":
            raise ValueError("`responses: native` needs a backend of type openai")
        if self.ca_file is not None:
            if not (self.url or "").startswith("https://"):
                raise ValueError("`ca_file` needs an https:// `url`")
            try:  # read now, so a bad bundle fails the policy, not the first request
                ssl.create_default_context(cafile=self.ca_file)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise ValueError(f"`ca_file` {self.ca_file} is not a PEM bundle of CA "
                                 f"certificates ({exc})") from None
        return self


class LatencyBudget(FileModel):
    ttft_ms: PositiveFloat | None = None
    total_ms: PositiveFloat | None = None


class Route(FileModel):
    targets: list[Target] = Field(min_length=1)  # "backend/model", in preference order
    objective: Literal["cheapest", "fastest"] = "cheapest"
    latency_budget: LatencyBudget = LatencyBudget()
    on_budget_miss: Literal["fastest", "reject"] = "fastest"
    expected_output_tokens: PositiveInt = 256  # until a running mean exists
    limits: Limits | None = None  # per tenant on this route, inside the tenant's limits
    cache: RouteCache | None = None  # None: answers on this route are never cached


class RouteCache(FileModel):
    """Whole answers kept and served again for identical requests."""

    ttl_s: PositiveFloat = 300.0
    max_entry_bytes: PositiveInt = 256 * 1024  # a larger answer is not kept
    scope: Literal["tenant", "global"] = "tenant"  # global: one tenant reads another's
    nondeterministic: bool = False  # also keep answers sampled with temperature > 0
    # keep answers although `compliance.record_content` is off (the gateway then holds
    # prompts and completions, hashed and whole, for `ttl_s`)
    store_content: bool = False


PiiCategory = Literal["email", "phone", "credit_card", "iban", "us_ssn", "ip_address"]


class PiiPolicy(FileModel):
    detect: list[PiiCategory] = []
    action: Literal["local_only", "redact", "block"] = "local_only"


class RuleWhen(FileModel):
    """When a rule applies: every non-empty condition must hold."""

    tenant_tags: list[str] = []  # matches when the tenant has any of these tags
    tenants: list[str] = []
    # Scoped to routes, a rule also holds for each of their targets asked for directly
    # by its `backend/model` name: what binds `chat` binds every target of `chat`,
    # however the request names it.
    routes: list[str] = []


class RuleRequire(FileModel):
    regions: list[str] = []  # glob patterns: `eu-*`
    deployment: Literal["shared", "dedicated"] | None = None
    data_retention: Literal["zero", "standard"] | None = None


class ComplianceRule(FileModel):
    name: str
    when: RuleWhen = RuleWhen()
    require: RuleRequire


class Compliance(FileModel):
    pii: PiiPolicy = PiiPolicy()
    rules: list[ComplianceRule] = []
    record_content: bool = False  # prompt and completion text on traced root spans (never logs)


class Limits(FileModel):
    requests_per_minute: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None


class Budget(FileModel):
    usd_per_day: NonNegativeFloat | None = None
    usd_per_month: NonNegativeFloat | None = None


Priority = Literal["high", "normal", "low"]


ModelGlob = Annotated[str, Field(min_length=1)]  # fnmatch pattern: `chat*`, `shared/*`


class KeyAccess(FileModel):
    """One API key's access, in place of its tenant's (a field left out: the tenant's)."""

    allow: list[ModelGlob] | None = None
    allow_targets: list[ModelGlob] | None = None


class Tenant(FileModel):
    api_keys: list[KeyHash] = []
    # What its callers may ask for by name; anything else is a 404 `model_not_found`, and
    # `/v1/models` lists only what they may use. None: `defaults.allow` /
    # `defaults.allow_targets`. `allow` matches route names; `allow_targets` matches
    # `backend/model` names asked for directly, past every route.
    allow: list[ModelGlob] | None = None
    allow_targets: list[ModelGlob] | None = None
    key_access: dict[KeyHash, KeyAccess] = {}  # per key (one of `api_keys`), overriding
    tags: list[str] = []
    priority: Priority = "normal"
    limits: Limits | None = None  # None: `defaults.limits`
    key_limits: Limits | None = None  # per API key, inside the tenant's limits
    budget: Budget = Budget()
    queue_weight: PositiveFloat = 1.0  # fair share against other tenants of its priority
    routes: dict[str, str] = {}  # asked-for route → the route that serves this tenant


class AnonymousAccess(FileModel):
    enabled: bool = False
    tenant: str = "anonymous"
    loopback_only: bool = True
    reject_unknown_keys: bool = False  # a presented key the policy does not know: 401


class Auth(FileModel):
    anonymous: AnonymousAccess = AnonymousAccess()
    admin_keys: list[KeyHash] = []  # sha256 hashes, like tenant keys


class Drain(FileModel):
    """What SIGTERM does: `/readyz` answers 503 at once; new connections are still
    served for `announce_s` (load balancers notice the 503 and stop sending); then the
    listener closes and requests in flight get up to `timeout_s` to finish. A stream
    still running then ends with an error event. A second SIGTERM cuts it short."""

    announce_s: NonNegativeFloat = 5.0
    timeout_s: NonNegativeFloat = 30.0


class ServerSettings(FileModel):
    max_body_bytes: PositiveInt = 4 * 1024 * 1024
    drain: Drain = Drain()


class LimitStore(FileModel):
    # memory | redis://host:port/db | redis+cluster://node,node | redis+sentinel://s,s/name
    store: str = Field("memory", json_schema_extra={  # editors only: `_store_known` checks
        "pattern": r"^(memory$|rediss?://|unix://|redis\+(cluster|sentinel)://)"})
    on_store_error: Literal["fail_open", "fail_closed"] = "fail_open"
    replicas: PositiveInt = 1  # fail-open share: each replica allows limit / replicas

    @field_validator("store")
    @classmethod
    def _store_known(cls, store: str) -> str:
        if store != "memory" and not store.startswith((
                "redis://", "rediss://", "unix://", "redis+cluster://", "redis+sentinel://")):
            raise ValueError("must be `memory`, a redis:// URL, redis+cluster://NODE,… "
                             "or redis+sentinel://SENTINEL,…/SERVICE")
        return store


class SharedState(FileModel):
    """State every replica and worker should see: `memory` (this process only) or Redis."""

    store: str = Field("memory", json_schema_extra={"pattern": r"^(memory$|rediss?://|unix://)"})
    max_memory_bytes: PositiveInt = 64 * 1024 * 1024  # the `memory` store's bound

    @field_validator("store")
    @classmethod
    def _store_known(cls, store: str) -> str:
        return LimitStore._store_known(store)


class ResponsesState(SharedState):
    """Responses kept for `GET /v1/responses/{id}` and `previous_response_id`."""

    ttl_s: PositiveFloat = 86_400.0


class Defaults(FileModel):
    limits: Limits = Limits(requests_per_minute=60, tokens_per_minute=50_000)
    priority: Priority = "normal"
    # Access of a tenant that sets none (and of anonymous callers): every route, and no
    # target by its direct `backend/model` name (that would skip the route's rules).
    allow: list[ModelGlob] = ["*"]
    allow_targets: list[ModelGlob] = []


class PolicyFile(FileModel):
    version: Literal[1]
    backends: dict[str, Backend] = Field(min_length=1)
    routes: dict[str, Route] = {}
    compliance: Compliance = Compliance()
    tenants: dict[str, Tenant] = {}
    defaults: Defaults = Defaults()
    auth: Auth = Auth()
    server: ServerSettings = ServerSettings()
    limits: LimitStore = LimitStore()
    responses: ResponsesState = ResponsesState()
    response_cache: SharedState = SharedState()  # where routes' `cache:` answers are kept
