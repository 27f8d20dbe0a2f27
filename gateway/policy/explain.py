"""`routegate policy explain FILE REQUEST.json`: the decision routing would make, and why.

It runs the gateway's own code (`routing.build_features` and `routing.decide`), not a
second implementation, with the policy's declared latency priors standing in for
live statistics. `--in-flight TARGET=N` simulates load on a backend, to see where
traffic spills once its queue breaks the latency budget.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from multidict import CIMultiDict

from policies.errors import PolicyError
from policies.hints import did_you_mean
from policies.load import Policy, load
from routing.decide import RouteDecision, decide
from routing.features import FeatureError, build_features
from routing.pii import PiiScanner
from routing.stats import StatsSnapshot, TargetSnapshot
from routing.tokens import TokenCounter


def add_explain_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser],
                       environ_with: Any) -> None:
    explain = commands.add_parser(
        "explain", help="print the routing decision for a request, without sending it")
    explain.add_argument("file", metavar="FILE", help="the policy file")
    explain.add_argument("request", metavar="REQUEST.json",
                         help="an OpenAI request body (`-` reads standard input)")
    explain.add_argument("--tenant", help="decide as this tenant (default: the anonymous one)")
    explain.add_argument("--header", action="append", default=[], metavar="K:V",
                         help="a request header, e.g. x-routegate-ttft-budget-ms:500")
    explain.add_argument("--in-flight", action="append", default=[], metavar="TARGET=N",
                         help="pretend N requests are running on backend/model")
    explain.add_argument("--json", action="store_true", help="the decision as JSON")
    explain.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                         type=env_assignment,
                         help="set a variable for ${NAME} references (repeatable)")
    explain.set_defaults(func=lambda args: explain_file(
        args.file, args.request, tenant=args.tenant, headers=args.header,
        in_flight=args.in_flight, as_json=args.json, environ=environ_with(args.env)))


def env_assignment(text: str) -> str:
    """An `--env` value: `NAME=VALUE` (VALUE may be empty, `NAME=` is deliberate)."""
    name, equals, _ = text.partition("=")
    if not equals or not name:
        raise argparse.ArgumentTypeError(f"{text!r}: write NAME=VALUE")
    return text


def simulated_stats(in_flight: Sequence[str]) -> StatsSnapshot:
    """Declared priors only (no samples), plus any simulated load."""
    targets: dict[str, TargetSnapshot] = {}
    for item in in_flight:
        key, _, count = item.rpartition("=")
        targets[key] = TargetSnapshot(in_flight=int(count))
    return StatsSnapshot(targets=targets)


def explain_request(policy: Policy, body: Mapping[str, Any], *, tenant: str | None = None,
                    headers: Sequence[str] = (), in_flight: Sequence[str] = (),
                    tokens: TokenCounter | None = None) -> RouteDecision:
    """The decision for `body` under `policy`, as the live gateway would make it cold."""
    header_map: CIMultiDict[str] = CIMultiDict()
    for header in headers:
        name, _, value = header.partition(":")
        header_map.add(name.strip(), value.strip())
    stats = simulated_stats(in_flight)
    features = build_features(
        body, header_map, policy, tenant or policy.file.auth.anonymous.tenant,
        tokens=tokens or TokenCounter(), pii=PiiScanner(policy.file.compliance.pii.detect),
        stats=stats)
    return decide(features, policy, stats, now=0.0, decision_id="explain")


def explain_file(policy_path: str, request_path: str, *, tenant: str | None = None,
                 headers: Sequence[str] = (), in_flight: Sequence[str] = (),
                 as_json: bool = False, environ: Mapping[str, str] | None = None,
                 out: TextIO | None = None) -> int:
    out = out or sys.stdout
    try:
        policy = load(policy_path, environ=environ)
        problem = _option_problem(policy, policy_path, tenant, in_flight)
        if problem is not None:
            print(f"error: {problem}", file=sys.stderr)
            return 1
        text = sys.stdin.read() if request_path == "-" else Path(request_path).read_text()
        body = json.loads(text)
        if not isinstance(body, dict):
            raise ValueError("the request must be a JSON object")
        decision = explain_request(policy, body, tenant=tenant, headers=headers,
                                   in_flight=in_flight)
    except PolicyError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except FeatureError as exc:
        refused = access_refusal(policy, body, tenant) if exc.not_found else None
        print(f"error: {request_path}: {refused or exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:  # JSONDecodeError is a ValueError
        print(f"error: {request_path}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(decision.to_dict(), indent=2), file=out)
    else:
        out.write(render(decision, policy))
    return 0


def access_refusal(policy: Policy, body: Mapping[str, Any], tenant: str | None) -> str | None:
    """Why a model that exists is, to this tenant, one that does not (its access)."""
    model = body.get("model")
    tenant = tenant or policy.file.auth.anonymous.tenant
    if not isinstance(model, str) or policy.resolve_model(model, tenant) is None:
        return None
    spec = policy.file.tenants.get(tenant)
    defaults = policy.file.defaults
    if model in policy.routes:
        field, globs = "allow", spec.allow if spec and spec.allow is not None else defaults.allow
    else:
        field = "allow_targets"
        globs = spec.allow_targets if spec and spec.allow_targets is not None \
            else defaults.allow_targets
    return (f"access: tenant {tenant!r} may not use {model!r} (its {field}: "
            f"{', '.join(globs) or 'nothing'}); to it the model does not exist (404)")


def _option_problem(policy: Policy, policy_path: str, tenant: str | None,
                    in_flight: Sequence[str]) -> str | None:
    """What is wrong with `--tenant` / `--in-flight` for this policy, or None. A target
    that is not in the policy would otherwise be ignored, and the simulation would
    silently show an idle backend."""
    tenants = [*policy.file.tenants, policy.file.auth.anonymous.tenant]
    if tenant is not None and tenant not in tenants:
        hint = did_you_mean(tenant, tenants)
        return f"--tenant: no tenant {tenant!r} in {policy_path}" + (f" ({hint})" if hint else "")
    for item in in_flight:
        key, _, count = item.rpartition("=")
        if not count.isdigit():
            return f"--in-flight {item}: write TARGET=N, N a number of requests"
        if key not in policy.targets:
            hint = did_you_mean(key, policy.targets)
            return (f"--in-flight {item}: no enabled target `{key}` in {policy_path}"
                    + (f" ({hint})" if hint else ""))
    return None


def _fleet_line(policy: Policy, target: str) -> str | None:
    """How a fleet target's replica is chosen (live, so not simulated here), or None."""
    backend = policy.file.backends.get(target.split("/", 1)[0])
    if backend is None or not backend.is_fleet:
        return None
    if backend.launch is not None:
        replicas = f"{backend.launch.replicas} launched replicas"
    elif backend.urls:
        replicas = f"{len(backend.urls)} listed replicas"
    else:
        replicas = f"every address of {backend.url} (resolve: all)"
    precise = " (precise)" if backend.pick == "prefix" and backend.fleet.prefix.precise else ""
    return (f"           {replicas}, pick {backend.pick}{precise}: the replica is chosen per "
            "request from their live load and prefix cache (not simulated offline)")


def render(decision: RouteDecision, policy: Policy) -> str:
    data = decision.to_dict()
    features = data["features"]
    lines = [
        f"policy {policy.source} (version {policy.version_hash})",
        f"route {decision.route!r}, objective {decision.objective or '-'}, "
        f"tenant {features['tenant']!r} (priority {features['priority']}"
        f"{', tags ' + ','.join(features['tenant_tags']) if features['tenant_tags'] else ''})",
        f"request: {features['input_tokens']} input tokens, {features['output_tokens']} output "
        f"tokens ({features['output_tokens_source']}), PII: "
        f"{', '.join(features['pii']) or 'none'}, needs: "
        f"{', '.join(features['needs']) or 'nothing special'}, budget TTFT "
        f"{_ms(features['ttft_budget_ms'])}, total {_ms(features['total_budget_ms'])}",
        "",
    ]
    if data["candidates"]:
        lines.append("candidates (in order):")
        for candidate in data["candidates"]:
            usd = candidate["cost_micro_usd"] / 1e6
            lines.append(
                f"  {candidate['role']:<8} {candidate['target']:<32} "
                f"TTFT {candidate['predicted_ttft_ms']:>8.0f} ms  "
                f"total {candidate['predicted_total_ms']:>8.0f} ms  "
                f"cost ${usd:.6f}  "
                f"{'within budget' if candidate['within_budget'] else 'OVER budget'}")
            fleet = _fleet_line(policy, candidate["target"])
            if fleet is not None:
                lines.append(fleet)
    if data["excluded"]:
        lines.append("excluded:")
        for excluded in data["excluded"]:
            lines.append(f"  {excluded['target']:<32} {excluded['reason']}: "
                         f"{excluded['detail']}")
    lines.append("")
    if decision.rejection is not None:
        lines.append(f"rejected: {decision.rejection.status} {decision.rejection.code}: "
                     f"{decision.rejection.message}")
    else:
        primary = data["candidates"][0]["target"]
        fallbacks = [c["target"] for c in data["candidates"][1:]]
        lines.append(f"chosen: {primary}" + (f"; fallbacks: {', '.join(fallbacks)}"
                                             if fallbacks else "; no fallback"))
        if decision.budget_missed:
            lines.append("note: no candidate fits the latency budget; on_budget_miss=fastest "
                         "chose the fastest")
        spread = data["spread"]
        if spread is not None:
            equals = ", ".join(f"{e['target']} (weight {e['weight']:g}, {e['outstanding']} "
                               "outstanding)" for e in spread["equals"])
            lines.append(f"spread within {spread['within_percent']:g} %: {equals}; drew "
                         f"{' and '.join(spread['drawn'])}, the less busy per weight leads "
                         "(the draws vary per request)")
    if decision.redact:
        lines.append(f"redacted before sending: {', '.join(sorted(decision.redact))}")
    return "\n".join(lines) + "\n"


def _ms(value: float | None) -> str:
    return "none" if value is None else f"{value:.0f} ms"
