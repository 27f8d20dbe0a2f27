"""The hot path's regression guard: instructions per request against a committed baseline.

CI runs this (`make perf-guard`, from `.ci/run`) so a change that makes the request path
slower cannot land unseen. It counts, with `bench/instructions.py` (valgrind, one run),
the hot-path probes — a whole JSON response, a streamed one, every request traced, rate
limits kept in Redis — and divides each by the bare aiohttp proxy's count for the same
kind of request measured in the same run. The ratio, not the raw count, is compared with
`bench/baseline.json`: it carries over between machines and interpreter builds that
change both sides alike. A probe whose ratio grew more than `--tolerance` (5 %) is
measured once more and fails the run when the lower of its two runs is still past it;
instruction counts repeat within 1–2 % (docs/benchmarks.md), wall time would not.

The baseline is updated deliberately, in the commit that justifies the change:

    .venv/bin/python bench/guard.py             # check (exit 1 on a regression)
    .venv/bin/python bench/guard.py --update    # measure and rewrite bench/baseline.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.instructions import PROBES, TRACED, measure

BASELINE = Path(__file__).resolve().parent / "baseline.json"
GUARDED = ("routegate", "routegate stream", TRACED, "routegate redis")
REQUESTS = 600
TOLERANCE = 0.05
# How many admissions and settlements share one Redis pipeline depends on how requests
# fall into event-loop turns, which varies from run to run more than anything else
# counted here (runs of the same code up to 13 % apart): a wider band for that probe
# alone, around a baseline that is the median of three rounds, not one lucky run.
PROBE_TOLERANCE = {"routegate redis": 0.12}


def ratios(counts: dict[str, int], names: Sequence[str] = GUARDED) -> dict[str, float]:
    """Each probe's instructions per request over its bare proxy's."""
    return {name: counts[name] / counts[PROBES[name].baseline] for name in names}


def regressions(now: dict[str, float], baseline: dict[str, float],
                tolerance: float) -> list[str]:
    """One line per probe whose ratio grew past its tolerance (`tolerance`, or the
    probe's own in `PROBE_TOLERANCE` where wider), or that has no baseline."""
    found = []
    for name, ratio in now.items():
        before = baseline.get(name)
        allowed = max(tolerance, PROBE_TOLERANCE.get(name, 0.0))
        if before is None:
            found.append(f"{name}: no baseline (run bench/guard.py --update)")
        elif ratio > before * (1 + allowed):
            found.append(f"{name}: {ratio:.3f}× the bare proxy, baseline {before:.3f}× "
                         f"(+{100 * (ratio / before - 1):.1f} %, tolerance "
                         f"{100 * allowed:g} %)")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true",
                        help="rewrite the baseline with this run's ratios")
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--tolerance", type=float, default=TOLERANCE,
                        help="the growth that fails, as a fraction (0.05: 5 %%)")
    args = parser.parse_args(argv)
    [counts] = measure([PROBES[name] for name in GUARDED], args.requests, rounds=1)
    now = ratios(counts)
    stored = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    baseline = stored.get("ratios", {})
    print(f"instructions per request, {args.requests} requests "
          f"(ratio: over the bare proxy's for the same kind of request)")
    for name in GUARDED:
        before = baseline.get(name)
        change = f"{100 * (now[name] / before - 1):+6.1f} %" if before else "   (new)"
        print(f"  {name:18} {counts[name]:>10,}   {now[name]:.3f}×   baseline "
              f"{before or float('nan'):.3f}×  {change}")
    if args.update:
        BASELINE.write_text(json.dumps({
            "measured": date.today().isoformat(), "requests": args.requests,
            "instructions": counts, "ratios": {k: round(v, 4) for k, v in now.items()},
        }, indent=2) + "\n")
        print(f"baseline written to {BASELINE}")
        return 0
    suspects = [name for name in GUARDED
                if regressions({name: now[name]}, baseline, args.tolerance)]
    if suspects:  # measured once more: a regression is past its band in both runs
        print(f"measuring again: {', '.join(suspects)}")
        [again] = measure([PROBES[name] for name in suspects], args.requests, rounds=1)
        now = lower_of(now, ratios(again, suspects))
        for name in suspects:
            print(f"  {name:18} {again[name]:>10,}   {now[name]:.3f}× (the lower run)")
    found = regressions(now, baseline, args.tolerance)
    for line in found:
        print(f"REGRESSION {line}")
    print("perf guard: " + ("FAILED" if found else "passed"))
    return 1 if found else 0


def lower_of(first: dict[str, float], second: dict[str, float]) -> dict[str, float]:
    """Each probe's lower ratio of two runs. A regression is in both; the Redis probe's
    noise (how requests fall into event-loop turns: 1,281,505 and 1,511,281 instructions
    per request for the same code in two rounds) seldom is."""
    return {name: min(ratio, second.get(name, ratio)) for name, ratio in first.items()}


if __name__ == "__main__":
    sys.exit(main())
