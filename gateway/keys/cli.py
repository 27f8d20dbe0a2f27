"""`routegate keys create|list|rotate|revoke`: the admin API from a shell.

The gateway's URL and an admin key come from `--url` / `--admin-key` or, better (a key in
a flag stays in the shell history), `ROUTEGATE_URL` and `ROUTEGATE_ADMIN_KEY`. A new key
is printed once; lists are a table (`--json` for scripts).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime
from typing import Any, TextIO

DEFAULT_URL = "http://127.0.0.1:8080"
TIMEOUT_S = 30.0


class AdminError(Exception):
    pass


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def common(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--url", help=f"the gateway (default $ROUTEGATE_URL or {DEFAULT_URL})")
        parser.add_argument("--admin-key", help="an admin key (default $ROUTEGATE_ADMIN_KEY)")
        parser.add_argument("--json", action="store_true", help="the API's JSON answer")

    create = commands.add_parser("create", help="issue a managed key (via the admin API)")
    common(create)
    create.add_argument("--tenant", required=True)
    create.add_argument("--name", default="")
    create.add_argument("--label", action="append", dest="labels", metavar="LABEL")
    create.add_argument("--allow", action="append", metavar="ROUTE",
                        help="a route (glob) the key may use; repeat (default: its tenant's)")
    create.add_argument("--allow-target", action="append", dest="allow_targets",
                        metavar="BACKEND/MODEL")
    create.add_argument("--rpm", type=int, help="requests per minute")
    create.add_argument("--tpm", type=int, help="tokens per minute")
    create.add_argument("--usd-per-day", type=float)
    create.add_argument("--usd-per-month", type=float)
    create.add_argument("--usd-total", type=float)
    create.add_argument("--expires-at", help="ISO 8601, e.g. 2027-01-31T00:00:00Z")
    create.add_argument("--scope", action="append", dest="scopes",
                        choices=["admin:read", "admin:write"])
    create.set_defaults(func=keys_create)

    listing = commands.add_parser("list", help="list managed keys")
    common(listing)
    listing.add_argument("--tenant")
    listing.add_argument("--label")
    listing.add_argument("--status", choices=["active", "revoked", "expired"])
    listing.set_defaults(func=keys_list)

    rotate = commands.add_parser("rotate", help="replace a key; the old one works --grace-s more")
    common(rotate)
    rotate.add_argument("id")
    rotate.add_argument("--grace-s", type=float, default=0.0)
    rotate.set_defaults(func=keys_rotate)

    revoke = commands.add_parser("revoke", help="revoke a key on every replica")
    common(revoke)
    revoke.add_argument("id")
    revoke.set_defaults(func=keys_revoke)


def _call(args: argparse.Namespace, method: str, path: str,
          body: dict[str, Any] | None = None) -> Any:
    url = (args.url or os.environ.get("ROUTEGATE_URL") or DEFAULT_URL).rstrip("/")
    key = args.admin_key or os.environ.get("ROUTEGATE_ADMIN_KEY")
    if not key:
        raise AdminError("no admin key: set ROUTEGATE_ADMIN_KEY (or --admin-key)")
    request = urllib.request.Request(
        url + path, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise AdminError(f"{exc.code}: {message}") from exc
    except urllib.error.URLError as exc:
        raise AdminError(f"cannot reach {url}: {exc.reason}") from exc


def _run(args: argparse.Namespace, work: Any, out: TextIO | None = None) -> int:
    try:
        work(args, out or sys.stdout)
    except AdminError as exc:
        print(f"routegate keys {args.keys_command}: {exc}", file=sys.stderr)
        return 1
    return 0


def keys_create(args: argparse.Namespace, out: TextIO | None = None) -> int:
    def work(args: argparse.Namespace, out: TextIO) -> None:
        body: dict[str, Any] = {"tenant": args.tenant, "name": args.name}
        for field in ("labels", "allow", "allow_targets", "scopes"):
            if getattr(args, field):
                body[field] = getattr(args, field)
        if args.rpm is not None or args.tpm is not None:
            body["limits"] = {"requests_per_minute": args.rpm, "tokens_per_minute": args.tpm}
        budget = {"usd_per_day": args.usd_per_day, "usd_per_month": args.usd_per_month,
                  "usd_total": args.usd_total}
        if any(value is not None for value in budget.values()):
            body["budget"] = budget
        if args.expires_at:
            body["expires_at"] = args.expires_at
        created = _call(args, "POST", "/admin/keys", body)
        if args.json:
            print(json.dumps(created), file=out)
            return
        print(f"id:  {created['id']}\nkey: {created['key']}\n# give the key to its user: "
              "it is shown only now (the gateway keeps its hash)", file=out)
    return _run(args, work, out)


def keys_list(args: argparse.Namespace, out: TextIO | None = None) -> int:
    def work(args: argparse.Namespace, out: TextIO) -> None:
        query = "&".join(f"{name}={value}" for name in ("tenant", "label", "status")
                         if (value := getattr(args, name)) is not None)
        keys: list[dict[str, Any]] = []
        after = ""
        while True:  # every page
            page = _call(args, "GET", f"/admin/keys?limit=1000&after={after}&{query}")
            keys += page["data"]
            if not page["has_more"]:
                break
            after = page["next_after"]
        if args.json:
            print(json.dumps(keys), file=out)
            return
        rows = [("ID", "TENANT", "NAME", "STATUS", "LABELS", "EXPIRES")] + [
            (key["id"], key["tenant"], key["name"], key["status"], ",".join(key["labels"]),
             _when(key["expires_at"])) for key in keys]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(cell.ljust(width) for cell, width in zip(row, widths,
                                                                      strict=True)).rstrip(),
                  file=out)
    return _run(args, work, out)


def keys_rotate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    def work(args: argparse.Namespace, out: TextIO) -> None:
        rotated = _call(args, "POST", f"/admin/keys/{args.id}/rotate",
                        {"grace_s": args.grace_s})
        if args.json:
            print(json.dumps(rotated), file=out)
            return
        until = rotated["previous_key_valid_until"]
        print(f"id:  {rotated['id']}\nkey: {rotated['key']}\n# the old key "
              + (f"works until {_when(until)}" if until else "no longer works"), file=out)
    return _run(args, work, out)


def keys_revoke(args: argparse.Namespace, out: TextIO | None = None) -> int:
    def work(args: argparse.Namespace, out: TextIO) -> None:
        revoked = _call(args, "POST", f"/admin/keys/{args.id}/revoke")
        print(json.dumps(revoked) if args.json else f"revoked {revoked['id']}", file=out)
    return _run(args, work, out)


def _when(epoch_s: float | None) -> str:
    if epoch_s is None:
        return "-"
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
