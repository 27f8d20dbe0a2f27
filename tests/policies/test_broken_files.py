"""Broken policy files: each error names the exact line, column and field, with a hint."""

from __future__ import annotations

from dataclasses import dataclass
from textwrap import dedent

import pytest

from policies import PolicyError, loads

BACKENDS = """\
version: 1
backends:
  local:
    type: openai
    url: http://127.0.0.1:8001/v1
    deployment: dedicated
    gpu_hour_usd: 2.5
    region: eu-west-1
    models:
      llama: {context_tokens: 8192}
  openai:
    type: openai
    url: https://api.openai.com/v1
    region: us
    models:
      gpt-4o-mini: {input_usd_per_mtok: 0.15, output_usd_per_mtok: 0.6}
"""  # 16 lines: appended text starts on line 17
TENANTS = """\
tenants:
  acme:
    api_keys: [sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]
    tags: [eu]
"""  # lines 17-20 when appended to BACKENDS


@dataclass(frozen=True)
class Broken:
    name: str
    text: str
    line: int | None
    column: int | None
    field: str | None
    message: str
    hint: str | None = None


def with_backends(extra: str) -> str:
    return BACKENDS + dedent(extra)


CASES = [
    Broken("unclosed list", "version: 1\nbackends:\n  a: [1, 2\n", 3, 6, None,
           "not valid YAML: the `[` opened here is never closed",
           "close it with `]` before the line ends"),
    Broken("tab indentation", "version: 1\nbackends:\n\ta: 1\n", 3, 1, None,
           "not valid YAML: a tab indents this line", "replace the tab with spaces"),
    Broken("tab after spaces", "version: 1\nbackends:\n  a:\n  \ttype: openai\n", 4, 3, None,
           "a tab indents this line", "replace the tab with spaces"),
    Broken("key indented between two levels",
           "version: 1\nbackends:\n  a:\n    type: openai\n   url: http://x\n", 5, 4, None,
           "indented 3 spaces, which matches no key", "indent it as the line above is (4 spaces)"),
    Broken("key indented under a value",
           "version: 1\nbackends:\n  a:\n    type: openai\n      url: http://x\n", 5, 7, None,
           "deeper than `type` above it", "indent it as `type` is (4 spaces)"),
    Broken("key without its colon, found on the next line",
           "version: 1\nbackends:\n  a:\n    type openai\n    url: http://x\n", 4, 5, None,
           "this line has no `:` after its key", "write `key: value`"),
    Broken("unclosed quote, found at the end of the file",
           'version: 1\nbackends:\n  a:\n    type: "openai\n    url: http://x\nroutes: {}\n',
           4, 11, None, 'the " opened here is never closed', 'close the value with "'),
    Broken("unclosed brace, found on the next line",
           "version: 1\nroutes:\n  chat: {targets: [a/m]\n  fast: {}\n", 3, 9, None,
           "the `{` opened here is never closed", "close it with `}` before the line ends"),
    Broken("empty file", "# nothing here\n", 1, 1, None, "empty"),
    Broken("top level is a list", "- version: 1\n", 1, 1, None, "must be a YAML mapping"),
    Broken("version missing", BACKENDS.replace("version: 1\n", "# v1\n"), 2, 1, "version",
           "`version` is required"),
    Broken("version unknown", BACKENDS.replace("version: 1", "version: 2"), 1, 10, "version",
           "Input should be 1"),
    Broken("top level key misspelt", "version: 1\nbackend:\n  a: {}\n", 1, 1, "backends",
           "`backends` is required"),
    Broken("top level unknown key", BACKENDS + "route:\n  chat: {targets: [local/llama]}\n",
           17, 1, "route", "unknown key `route`", "did you mean `routes`?"),
    Broken("no backends", "version: 1\nbackends: {}\n", 2, 1, "backends",
           "at least 1 item"),
    Broken("backend type misspelt", BACKENDS.replace("type: openai", "type: opnai", 1), 4, 11,
           "backends.local.type", "Input should be 'openai' or 'anthropic'",
           "did you mean `openai`?"),
    Broken("backend url scheme", BACKENDS.replace("url: http://", "url: tcp://", 1), 5, 10,
           "backends.local.url", "must start with http:// or https://"),
    Broken("backend key misspelt", BACKENDS.replace("    url: http", "    urll: http", 1), 5, 5,
           "backends.local.urll", "unknown key `urll`", "did you mean `url`?"),
    Broken("backend without url or launch",
           BACKENDS.replace("    url: http://127.0.0.1:8001/v1\n", ""), 3, 3,
           "backends.local", "needs `url`, or `launch`"),
    Broken("backend without models",
           "version: 1\nbackends:\n  a:\n    type: openai\n    url: http://x\n    models: {}\n",
           6, 5, "backends.a.models", "at least 1 item"),
    Broken("negative price", BACKENDS.replace("input_usd_per_mtok: 0.15",
                                              "input_usd_per_mtok: -1"), 16, 41,
           "backends.openai.models.gpt-4o-mini.input_usd_per_mtok", "greater than or equal to 0"),
    Broken("zero context", BACKENDS.replace("context_tokens: 8192", "context_tokens: 0"), 10, 31,
           "backends.local.models.llama.context_tokens", "greater than 0"),
    Broken("context not a number", BACKENDS.replace("context_tokens: 8192", "context_tokens: lots"),
           10, 31, "backends.local.models.llama.context_tokens", "valid integer"),
    Broken("model key misspelt", BACKENDS.replace("output_usd_per_mtok", "output_usd_per_mtoken"),
           16, 47, "backends.openai.models.gpt-4o-mini.output_usd_per_mtoken",
           "unknown key", "did you mean `output_usd_per_mtok`?"),
    Broken("prior key misspelt",
           BACKENDS.replace("{context_tokens: 8192}", "{priors: {decode_tokens_per_sec: 40}}"),
           10, 24, "backends.local.models.llama.priors.decode_tokens_per_sec", "unknown key",
           "did you mean `decode_tokens_per_s`?"),
    Broken("deployment misspelt", BACKENDS.replace("deployment: dedicated", "deployment: dedicatd"),
           6, 17, "backends.local.deployment", "Input should be", "did you mean `dedicated`?"),
    Broken("data retention misspelt", BACKENDS.replace("region: us", "data_retention: zer0"),
           14, 21, "backends.openai.data_retention", "'zero' or 'standard'",
           "did you mean `zero`?"),
    Broken("route target unknown", with_backends("""
        routes:
          chat:
            targets: [local/llama, openai/gpt-4o-mni]
        """), 20, 28, "routes.chat.targets[1]", "target `openai/gpt-4o-mni` names no backend model",
           "did you mean `openai/gpt-4o-mini`?"),
    Broken("route target without backend", with_backends("""
        routes:
          chat:
            targets:
              - local/llama
              - gpt-4o-mini
        """), 22, 9, "routes.chat.targets[1]", "must be written as backend/model"),
    Broken("backend name with a slash",
           BACKENDS.replace("  openai:\n", "  open/ai:\n") + dedent("""\
        routes:
          chat: {targets: [open/ai/gpt-4o-mini]}
        """), 11, 3, "backends.open/ai", "a backend name cannot contain `/`",
           "rename it, e.g. `open-ai`"),
    Broken("route without targets", with_backends("""
        routes:
          chat: {targets: []}
        """), 19, 10, "routes.chat.targets", "at least 1 item"),
    Broken("objective misspelt", with_backends("""
        routes:
          chat: {targets: [local/llama], objective: cheap}
        """), 19, 45, "routes.chat.objective", "'cheapest', 'fastest' or 'ordered'",
           "did you mean `cheapest`?"),
    Broken("on_budget_miss misspelt", with_backends("""
        routes:
          chat:
            targets: [local/llama]
            on_budget_miss: rejct
        """), 21, 21, "routes.chat.on_budget_miss", "Input should be", "did you mean `reject`?"),
    Broken("negative latency budget", with_backends("""
        routes:
          chat:
            targets: [local/llama]
            latency_budget: {ttft_ms: -5, total_ms: 1000}
        """), 21, 31, "routes.chat.latency_budget.ttft_ms", "greater than 0"),
    Broken("target listed twice", with_backends("""
        routes:
          chat: {targets: [local/llama, openai/gpt-4o-mini, local/llama]}
        """), 19, 53, "routes.chat.targets[2]", "listed twice"),
    Broken("route named like a target", with_backends("""
        routes:
          local/llama: {targets: [openai/gpt-4o-mini]}
        """), 19, 3, "routes.local/llama", "hides it"),
    Broken("tenant route override from an unknown route", with_backends("""
        routes:
          chat: {targets: [local/llama]}
        tenants:
          acme:
            routes: {chta: chat}
        """), 22, 14, "tenants.acme.routes.chta", "route `chta` does not exist",
           "did you mean `chat`?"),
    Broken("pii category misspelt", with_backends("""
        compliance:
          pii: {detect: [email, phnoe]}
        """), 19, 25, "compliance.pii.detect[1]", "Input should be", "did you mean `phone`?"),
    Broken("pii action unknown", with_backends("""
        compliance:
          pii:
            action: drop
        """), 20, 13, "compliance.pii.action", "'local_only', 'redact' or 'block'"),
    Broken("rule without require", with_backends("""
        compliance:
          rules:
            - name: eu
              when: {tenant_tags: [eu]}
        """), 20, 7, "compliance.rules[0].require", "`require` is required"),
    Broken("rule names unknown tenant", BACKENDS + TENANTS + dedent("""\
        compliance:
          rules:
            - name: acme-eu
              when: {tenants: [acmee]}
              require: {regions: [eu-*]}
        """), 24, 24, "compliance.rules[0].when.tenants[0]", "no tenant `acmee`",
           "did you mean `acme`?"),
    Broken("rule names unknown route", with_backends("""
        routes:
          chat: {targets: [local/llama]}
        compliance:
          rules:
            - name: chat-local
              when: {routes: [chta]}
              require: {deployment: dedicated}
        """), 23, 23, "compliance.rules[0].when.routes[0]", "no route `chta`",
           "did you mean `chat`?"),
    Broken("rule name used twice", with_backends("""
        compliance:
          rules:
            - {name: local, require: {deployment: dedicated}}
            - {name: local, require: {regions: [eu-*]}}
        """), 21, 14, "compliance.rules[1].name", "used twice"),
    Broken("plain key instead of hash", with_backends("""
        tenants:
          acme: {api_keys: [sk-live-123]}
        """), 19, 21, "tenants.acme.api_keys[0]", "never plain keys"),
    Broken("key hash on two tenants", BACKENDS + TENANTS + """\
  globex:
    api_keys: [sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa]
""", 22, 16, "tenants.globex.api_keys[0]", "already belongs to tenant `acme`"),
    Broken("priority unknown", with_backends("""
        tenants:
          acme: {priority: urgent}
        """), 19, 20, "tenants.acme.priority", "'high', 'normal' or 'low'"),
    Broken("tenant given the batch band", with_backends("""
        tenants:
          acme: {priority: batch}
        """), 19, 20, "tenants.acme.priority", "`batch` is the Batch API's own band"),
    Broken("default priority the batch band", with_backends("""
        defaults:
          priority: batch
        """), 19, 13, "defaults.priority", "no tenant can be given it"),
    Broken("zero rate limit", with_backends("""
        defaults:
          limits: {requests_per_minute: 0}
        """), 19, 33, "defaults.limits.requests_per_minute", "greater than 0"),
    Broken("limit store unknown", with_backends("""
        limits: {store: mysql://db}
        """), 18, 17, "limits.store", "must be `memory`, a redis:// URL"),
    Broken("admin key not a hash", with_backends("""
        auth:
          admin_keys: [letmein]
        """), 19, 16, "auth.admin_keys[0]", "never plain keys"),
    Broken("environment variable unset",
           BACKENDS.replace("url: https://api.openai.com/v1",
                            "url: https://api.openai.com/v1\n    api_key: Bearer ${OPENAI_KEY}"),
           14, 21, "backends.openai.api_key", "environment variable OPENAI_KEY is not set",
           "set OPENAI_KEY, or write ${OPENAI_KEY:-default}"),
    Broken("duplicate yaml key",
           BACKENDS.replace("    region: us\n", "    region: us\n    region: eu\n"),
           15, 5, None, "duplicate key `region` (first written on line 14)"),
    Broken("launch on anthropic backend",
           BACKENDS.replace("    type: openai\n    url: http://127.0.0.1:8001/v1\n",
                            "    type: anthropic\n    launch: {model: demo}\n"),
           5, 5, "backends.local.launch", "`launch` starts a local_backend",
           "write `type: openai`"),
    Broken("bool not a bool", BACKENDS.replace("    region: us\n", "    enabled: maybe\n"),
           14, 14, "backends.openai.enabled", "valid boolean"),
    Broken("credentials in a backend url",
           BACKENDS.replace("url: https://api", "url: https://user:s3cret@api"),
           13, 10, "backends.openai.url", "must not carry credentials"),
    Broken("ca_file that does not exist",
           BACKENDS.replace("    region: us\n", "    ca_file: /nonexistent/ca.pem\n"),
           14, 14, "backends.openai.ca_file", "no such file: /nonexistent/ca.pem"),
    Broken("ca_file for a plain http url",
           BACKENDS.replace("    deployment: dedicated\n", f"    ca_file: {__file__}\n", 1),
           3, 3, "backends.local", "`ca_file` needs an https:// `url`"),
    Broken("ca_file that is not a PEM bundle",  # this test file: not a certificate
           BACKENDS.replace("    region: us\n", f"    ca_file: {__file__}\n"),
           11, 3, "backends.openai", "is not a PEM bundle of CA certificates"),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_broken_file_is_reported_at_its_exact_place(case: Broken) -> None:
    with pytest.raises(PolicyError) as raised:
        loads(case.text, source="policy.yaml", environ={})
    issue = raised.value.issues[0]
    assert (issue.line, issue.column, issue.field_path) == (case.line, case.column, case.field)
    assert case.message in issue.message
    assert issue.hint == case.hint
    assert issue.source == "policy.yaml"


def test_a_refused_backend_url_is_not_echoed() -> None:
    text = BACKENDS.replace("url: https://api", "url: https://user:s3cret@api")
    with pytest.raises(PolicyError) as raised:
        loads(text, source="policy.yaml", environ={})
    assert "s3cret" not in str(raised.value)


def test_there_are_at_least_thirty_broken_files() -> None:
    assert len(CASES) >= 30


def test_a_tenant_route_override_must_name_existing_routes() -> None:
    text = BACKENDS + """routes:
  chat: {targets: [local/llama]}
tenants:
  acme:
    routes: {chat: chat-fsat}
"""
    with pytest.raises(PolicyError) as caught:
        loads(text, environ={})
    (issue,) = caught.value.issues
    assert issue.field_path == "tenants.acme.routes.chat"
    assert "chat-fsat" in issue.message


def test_an_unset_variable_in_a_number_field_is_one_error() -> None:
    text = BACKENDS.replace("    region: us\n", "    max_concurrency: ${NOPE}\n")
    with pytest.raises(PolicyError) as raised:
        loads(text, source="policy.yaml", environ={})
    [issue] = raised.value.issues
    assert issue.message == "environment variable NOPE is not set"


def test_a_plain_key_in_the_policy_is_answered_with_commands_that_keep_it_out_of_history(
        ) -> None:
    text = BACKENDS + "tenants:\n  acme: {api_keys: [rg-plain-key]}\n"
    with pytest.raises(PolicyError) as raised:
        loads(text, source="policy.yaml", environ={})
    message = raised.value.issues[0].message
    assert "`routegate keys new`" in message and "`routegate keys hash`" in message
    assert "keys hash KEY" not in message
