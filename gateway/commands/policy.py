"""`routegate policy check|schema|reference|explain`: validate policy files before they go live."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from gateway.keys.clash import store_clashes
from gateway.policy.explain import add_explain_parser, env_assignment
from policies.errors import PolicyError, PolicyIssue
from policies.json_schema import render as render_schema
from policies.load import Policy, load
from policies.reference_doc import render as render_reference


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    policy = subparsers.add_parser("policy", help="check, explain and describe policy files")
    commands = policy.add_subparsers(dest="policy_command", required=True, metavar="COMMAND")

    check = commands.add_parser(
        "check", help="validate policy files (exit 0 when all are valid, 1 otherwise)")
    check.add_argument("files", nargs="+", metavar="FILE")
    check.add_argument("--json", action="store_true", help="machine-readable result for CI")
    check.add_argument("--strict", action="store_true", help="warnings fail the check too")
    check.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                       type=env_assignment,
                       help="set a variable for ${NAME} references (repeatable)")
    check.add_argument("--keys", action="store_true",
                       help="also compare with the managed keys in the store the policy "
                            "names (connects to it): a hash listed in both is a warning")
    check.set_defaults(func=lambda args: check_files(
        args.files, as_json=args.json, strict=args.strict, environ=environ_with(args.env),
        keys=args.keys))

    schema = commands.add_parser("schema", help="print the JSON Schema of policy files")
    schema.set_defaults(func=lambda args: print_schema())
    reference = commands.add_parser(
        "reference", help="print the reference of every policy field (docs/policy.md)")
    reference.set_defaults(func=lambda args: print(render_reference(), end="") or 0)

    add_explain_parser(commands, environ_with)


def environ_with(assignments: Sequence[str]) -> dict[str, str]:
    """The process environment plus `NAME=VALUE` assignments from the command line."""
    environ = dict(os.environ)
    for assignment in assignments:
        name, _, value = assignment.partition("=")
        environ[name] = value
    return environ


def check_files(paths: Sequence[str], *, as_json: bool = False, strict: bool = False,
                environ: Mapping[str, str] | None = None, out: TextIO | None = None,
                keys: bool = False) -> int:
    """`keys`: compare with the managed keys' store too (the check is offline without)."""
    out = out or sys.stdout
    results: list[dict[str, Any]] = []
    failed = False
    for path in paths:
        errors: tuple[PolicyIssue, ...] = ()
        warnings: tuple[PolicyIssue, ...] = ()
        policy: Policy | None = None
        try:
            policy = load(path, environ=environ)
            warnings = policy.warnings
            if keys:
                warnings += tuple(store_clashes(policy, os.environ if environ is None
                                                else environ))
        except PolicyError as exc:
            errors = exc.issues
        valid = not errors and not (strict and warnings)
        failed = failed or not valid
        results.append({
            "file": path, "valid": valid,
            "version_hash": policy.version_hash if policy else None,
            "errors": [issue.as_dict() for issue in errors],
            "warnings": [issue.as_dict() for issue in warnings],
        })
        if not as_json:
            _print_result(path, policy, errors, warnings, out)
    if as_json:
        print(json.dumps({"valid": not failed, "files": results}, indent=2), file=out)
    return 1 if failed else 0


def _print_result(path: str, policy: Policy | None, errors: Sequence[PolicyIssue],
                  warnings: Sequence[PolicyIssue], out: TextIO) -> None:
    for issue in errors:
        print(f"error: {issue.render()}", file=out)
    for issue in warnings:
        print(f"warning: {issue.render()}", file=out)
    if policy is None:
        print(f"{path}: invalid ({counted(len(errors), 'error')})", file=out)
        return
    summary = ", ".join((counted(len(policy.targets), "target"),
                         counted(len(policy.routes), "route"),
                         counted(len(policy.file.tenants), "tenant")))
    tail = f", {counted(len(warnings), 'warning')}" if warnings else ""
    print(f"{path}: ok, version {policy.version_hash} ({summary}{tail})", file=out)


def counted(count: int, noun: str) -> str:
    """`1 route`, `0 routes`, `2 routes`."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def print_schema(out: TextIO | None = None) -> int:
    (out or sys.stdout).write(render_schema())
    return 0
