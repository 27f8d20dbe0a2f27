"""Span attribute names: the OpenTelemetry GenAI and HTTP semantic conventions, and
routegate's own. A module of names only, so the exporter process (which rebuilds a
request's spans from its record, `span_build.py`) imports no OpenTelemetry.
"""

# OpenTelemetry GenAI semantic conventions (gen_ai.*).
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_PROMPT = "gen_ai.prompt"  # only with compliance.record_content
GEN_AI_COMPLETION = "gen_ai.completion"  # only with compliance.record_content
EVENT_FIRST_TOKEN = "gen_ai.first_token"

# HTTP / server conventions.
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

# routegate's own facts.
RG_REQUEST_ID = "routegate.request_id"
RG_TENANT = "routegate.tenant"
RG_ROUTE = "routegate.route"
RG_BATCH_ID = "routegate.batch.id"  # a Batch API line: its batch
RG_BACKEND = "routegate.backend"
RG_DECISION_ID = "routegate.decision.id"
RG_DECISION_REASON = "routegate.decision.reason"
RG_CANDIDATES = "routegate.decision.candidates"
RG_EXCLUDED = "routegate.decision.excluded"
RG_PREDICTED_TTFT_MS = "routegate.predicted.ttft_ms"
RG_PREDICTED_TOTAL_MS = "routegate.predicted.total_ms"
RG_PREDICTED_COST_USD = "routegate.predicted.cost_usd"
RG_ACTUAL_TTFT_MS = "routegate.actual.ttft_ms"
RG_QUEUE_WAIT_MS = "routegate.queue.wait_ms"
RG_ATTEMPT = "routegate.attempt"
RG_DEADLINE_MS = "routegate.deadline_ms"  # budget left when the attempt was sent
RG_FALLBACK = "routegate.fallback"
RG_STREAM = "routegate.stream"
RG_GW_MS = "routegate.timing.gw_ms"
RG_UPSTREAM_MS = "routegate.timing.upstream_ms"
RG_INFERENCE_MS = "routegate.timing.inference_ms"  # backend-reported; absent when unknown
RG_TOTAL_MS = "routegate.timing.total_ms"
RG_COST_USD = "routegate.cost_usd"
RG_CACHE = "routegate.cache"  # hit | miss | bypass, on a route with a response cache
