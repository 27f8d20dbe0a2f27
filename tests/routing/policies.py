"""Policy texts shared by the routing tests."""

from __future__ import annotations

from policies.load import Policy, loads

# A dedicated EU GPU box, a zero-retention US API and a standard-retention US API.
BASE = """
version: 1
backends:
  local:
    type: openai
    url: http://127.0.0.1:8001/v1
    deployment: dedicated
    region: eu-west-1
    data_retention: zero
    gpu_hour_usd: 0.5
    max_concurrency: 4
    models:
      llama:
        context_tokens: 8192
        priors: {network_ms: 2, prefill_tokens_per_s: 4000, decode_tokens_per_s: 50}
  openai:
    type: openai
    url: http://127.0.0.1:8002/v1
    deployment: shared
    region: us
    data_retention: zero
    models:
      gpt-4o-mini:
        {input_usd_per_mtok: 0.15, output_usd_per_mtok: 0.60, context_tokens: 128000,
         priors: {network_ms: 80, decode_tokens_per_s: 100}}
  anthropic:
    type: openai
    url: http://127.0.0.1:8003/v1
    deployment: shared
    models:
      haiku:
        {input_usd_per_mtok: 1.0, output_usd_per_mtok: 5.0,
         priors: {network_ms: 120, decode_tokens_per_s: 80}}
routes:
  chat:
    targets: [local/llama, openai/gpt-4o-mini, anthropic/haiku]
    objective: {objective}
    latency_budget: {ttft_ms: 800, total_ms: 20000}
    on_budget_miss: {on_miss}
compliance:
  pii: {detect: [email, phone, credit_card, iban, us_ssn, ip_address], action: {pii_action}}
  rules:
    - name: eu-data-stays-in-eu
      when: {tenant_tags: [eu]}
      require: {regions: [eu-*]}
    - name: zdr-for-bank
      when: {tenants: [bank]}
      require: {data_retention: zero}
tenants:
  acme: {tags: [eu]}
  bank: {}
  globex: {priority: low, allow_targets: [openai/*]}
"""


def policy(*, pii_action: str = "local_only", on_miss: str = "fastest",
           objective: str = "cheapest") -> Policy:
    return loads(BASE.replace("{pii_action}", pii_action).replace("{on_miss}", on_miss)
                 .replace("{objective}", objective))
