"""Routing costs on the request path, measured side by side in one run.

    .venv/bin/python bench/routing.py

Prints the p50/p90 of `Router.decide` with 10 and 100 candidate targets (the
issue's bar: p50 ≤ 20 µs and ≤ 100 µs), plain and with capability checks on (the
request needs tools, which half the targets lack; a route-scoped rule); the cost of
the access check and of reading a body's needs; and the cost of token estimation and
of the PII scan per 1k tokens of prompt.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from policies.load import loads
from routing.capabilities import TOOLS, needs_of
from routing.decide import Router
from routing.features import RequestFeatures
from routing.pii import CATEGORIES, PiiScanner
from routing.stats import LiveStats
from routing.tokens import EXACT_COUNT_MAX_CHARS, TokenCounter


def policy_text(targets: int) -> str:
    """A route over `targets` models: half dedicated (EU), half shared (US), one EU rule."""
    lines = ["version: 1", "backends:"]
    keys = []
    for i in range(targets):
        dedicated = i % 2 == 0
        lines += [
            f"  b{i}:", "    type: openai", f"    url: http://127.0.0.1:{9000 + i}/v1",
            f"    deployment: {'dedicated' if dedicated else 'shared'}",
            f"    region: {'eu-west-1' if dedicated else 'us'}",
        ]
        if dedicated:
            lines += [f"    gpu_hour_usd: {1 + i % 5}", "    max_concurrency: 8"]
        lines += ["    models:",
                  f"      m: {{input_usd_per_mtok: {0.1 * (i + 1):.2f}, "
                  f"output_usd_per_mtok: {0.4 * (i + 1):.2f}, context_tokens: 32000, "
                  f"capabilities: {{tools: {'false' if dedicated else 'true'}}}}}"]
        keys.append(f"b{i}/m")
    lines += ["routes:", "  chat:", f"    targets: [{', '.join(keys)}]",
              "    latency_budget: {ttft_ms: 800, total_ms: 20000}",
              "compliance:", "  pii: {detect: [email], action: local_only}",
              "  rules:", "    - name: eu", "      when: {tenant_tags: [eu]}",
              "      require: {regions: [eu-*]}",
              "    - name: chat-declared-region", "      when: {routes: [chat]}",
              "      require: {regions: ['*']}",
              "tenants:", "  acme: {tags: [eu]}",
              "  globex: {allow: [chat*], allow_targets: [b1/*]}"]
    return "\n".join(lines) + "\n"


def time_decide(targets: int, rounds: int = 20_000,
                needs: int = 0) -> tuple[float, float]:
    policy = loads(policy_text(targets))
    router = Router(policy)
    stats = LiveStats()
    rng = random.Random(7)
    for key in policy.targets:
        for _ in range(5):
            stats.record_success(key, network_ms=rng.uniform(1, 40), ttft_ms=rng.uniform(50, 400),
                                 total_ms=rng.uniform(1000, 4000), output_tokens=200)
        for _ in range(rng.randrange(0, 12)):
            stats.request_started(key)
    snapshot = stats.snapshot()
    features = RequestFeatures(
        route="chat", tenant="globex", tenant_tags=frozenset(), priority="normal",
        input_tokens=900, output_tokens=250, output_tokens_source="request", stream=True,
        pii=frozenset(), ttft_budget_ms=800.0, total_budget_ms=20_000.0,
        tenant_budget_left_micro_usd=None, needs=needs)
    samples = []
    clock = time.perf_counter_ns
    for i in range(rounds):
        start = clock()
        router.decide(features, snapshot, 1000.0, "bench")
        samples.append(clock() - start)
        if i == 0:
            samples.clear()  # the first call fills the (route, tenant) cache
    samples.sort()
    return samples[len(samples) // 2] / 1000, samples[int(len(samples) * 0.9)] / 1000


def prompt(tokens_target: int, counter: TokenCounter) -> str:
    source = (Path(__file__).resolve().parent.parent / "routing" / "decide.py").read_text()
    words = [w for w in source.split() if w.isalpha()]
    rng = random.Random(3)
    text = " ".join(rng.choice(words) for _ in range(tokens_target))
    while counter.count_text(text) > tokens_target:
        text = text[: int(len(text) * 0.95)]
    return text


def per_call_us(fn: object, arg: str, rounds: int) -> float:
    call = fn  # type: ignore[assignment]
    times = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        call(arg)  # type: ignore[operator]
        times.append(time.perf_counter_ns() - start)
    return statistics.median(times) / 1000


def main() -> int:
    print("routing decide() latency (one route, all targets candidates, live stats)")
    for targets, bar in ((10, 20), (100, 100)):
        for label, needs in (("plain", 0), ("needs tools", TOOLS)):
            p50, p90 = time_decide(targets, rounds=20_000 if targets == 10 else 5_000,
                                   needs=needs)
            print(f"  {targets:>3} candidates, {label:<11}: p50 {p50:6.1f} µs  "
                  f"p90 {p90:6.1f} µs  (bar p50 ≤ {bar} µs)")
    policy = loads(policy_text(10))
    access = per_call_us(lambda name: policy.usable(name, "globex", None), "chat", 20_000)
    body = {"model": "chat", "messages": [{"role": "user", "content": "hi"}] * 4,
            "tools": [{"type": "function", "function": {"name": "f"}}]}
    needs_us = per_call_us(lambda _: needs_of(body), "", 20_000)
    print(f"  access check (policy.usable) {access:5.2f} µs; a body's needs "
          f"(needs_of, 4 messages + tools) {needs_us:5.2f} µs")

    counter = TokenCounter()
    scanner = PiiScanner(CATEGORIES)
    print("per-request scans (median of repeated calls; token counts are exact up to "
          f"{EXACT_COUNT_MAX_CHARS:,} chars, sampled above)")
    for tokens in (1_000, 4_000):
        text = prompt(tokens, counter)
        count = per_call_us(counter.count_text, text, 200)
        scan = per_call_us(scanner.scan, text, 200)
        print(f"  {tokens:>5}-token prompt: token count {count:7.1f} µs "
              f"({count * 1000 / tokens:5.1f} µs/1k tok)   PII scan {scan:7.1f} µs "
              f"({scan * 1000 / tokens:5.1f} µs/1k tok)")
    long_text = prompt(4_000, counter) * 50  # ~200k tokens: the sampled estimate
    exact = len(counter.encoding_for("").encode_ordinary(long_text))
    estimate = counter.count_text(long_text)
    sampled_us = per_call_us(counter.count_text, long_text, 20)
    print(f"  ~{exact // 1000}k-token prompt: sampled count {sampled_us:7.1f} µs, "
          f"estimate {estimate} vs exact {exact} ({(estimate - exact) / exact:+.1%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
