"""`routegate` command line. Each command module exposes `add_parser(subparsers)`,
which registers its subcommand and sets `func(args) -> int`; adding one is an import
and an entry in `COMMANDS`."""

from __future__ import annotations

import argparse
import sys

from gateway.commands import keys as key_commands
from gateway.commands import policy as policy_commands
from gateway.server import serve
from gateway.settings import package_version

COMMANDS = (serve, policy_commands, key_commands)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="routegate", description=(
        "OpenAI-compatible inference gateway that routes each request by policy."))
    parser.add_argument("--version", action="version",
                        version=f"routegate {package_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    return int(args.func(args))
