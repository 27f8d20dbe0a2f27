"""`routegate keys new|hash`: make API keys and the hashes the policy file stores
(`create|list|rotate|revoke`, for managed keys, are in `gateway/keys/cli.py`)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TextIO

from gateway.keys.cli import add_commands as add_service_commands
from policies.keys import hash_key, new_key


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    keys = subparsers.add_parser("keys", help="make API keys and their hashes")
    commands = keys.add_subparsers(dest="keys_command", required=True, metavar="COMMAND")
    make = commands.add_parser(
        "new", help="print a new random API key and its hash",
        description="Give the key to the client and put only the hash in the policy file.")
    make.add_argument("--count", type=int, default=1, help="how many keys (default 1)")
    make.add_argument("--json", action="store_true", help="one JSON object per key")
    make.set_defaults(func=lambda args: keys_new(count=args.count, as_json=args.json))
    hashed = commands.add_parser(
        "hash", help="print the hash of an existing key",
        description="Without KEY the key is read from standard input, which keeps it out "
                    "of the shell history.")
    hashed.add_argument("key", nargs="?", help="the API key (default: read standard input)")
    hashed.set_defaults(func=lambda args: keys_hash(args.key))
    add_service_commands(commands)  # create|list|rotate|revoke: managed keys, over HTTP


def keys_new(*, count: int = 1, as_json: bool = False, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if count < 1:
        print("routegate keys new: --count must be at least 1", file=sys.stderr)
        return 2
    for _ in range(count):
        key = new_key()
        if as_json:
            print(json.dumps({"key": key, "hash": hash_key(key)}), file=out)
        else:
            print(f"key:  {key}\nhash: {hash_key(key)}", file=out)
    if not as_json:
        print("# give the key to the client (it is shown only now); put the hash in "
              "tenants.<name>.api_keys or auth.admin_keys", file=out)
    return 0


def keys_hash(key: str | None, *, stdin: TextIO | None = None,
              out: TextIO | None = None) -> int:
    out = out or sys.stdout
    if key is None:
        key = (stdin or sys.stdin).readline().strip()
    if not key:
        print("routegate keys hash: no key given", file=sys.stderr)
        return 2
    print(hash_key(key), file=out)
    return 0
