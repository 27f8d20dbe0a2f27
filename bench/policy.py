"""Policy loading cost, side by side: parse + validate + cross-field checks per file,
how long a broken file takes to report, and `explain`'s decision.

    .venv/bin/python bench/policy.py
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gateway.policy.explain import explain_request  # noqa: E402
from policies import PolicyError, load, loads  # noqa: E402
from routing.tokens import TokenCounter  # noqa: E402

REPEAT = 200


def per_call_ms(call: Callable[[], object], repeat: int = REPEAT) -> float:
    call()  # warm caches (tiktoken, pydantic validators)
    start = time.perf_counter()
    for _ in range(repeat):
        call()
    return (time.perf_counter() - start) * 1000.0 / repeat


def main() -> int:
    examples = sorted((ROOT / "policies" / "examples").glob("*.yaml"))
    files = [ROOT / "policies" / "default.yaml", *examples]
    print(f"{'policy file':<34} {'lines':>5} {'load ms':>9}")
    for path in files:
        lines = len(path.read_text().splitlines())
        load_ms = per_call_ms(partial(load, path, environ={}))
        print(f"{path.name:<34} {lines:>5} {load_ms:>9.2f}")

    broken = (files[1].read_text().replace("objective: cheapest", "objective: cheap")
              .replace("type: openai", "type: opnai", 1))

    def report_broken() -> None:
        try:
            loads(broken, environ={})
        except PolicyError:
            return
        raise AssertionError("the broken file loaded")

    print(f"{'broken file (2 errors, hints)':<34} {'':>5} {per_call_ms(report_broken):>9.2f}")
    policy = load(ROOT / "policies/examples/local-first-spillover.yaml", environ={})
    tokens = TokenCounter()
    body = {"model": "chat", "messages": [{"role": "user", "content": "Summarise Hamlet."}]}
    explain_ms = per_call_ms(lambda: explain_request(policy, body, tokens=tokens), 2000)
    print(f"{'explain (features + decide)':<34} {'':>5} {explain_ms:>9.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
