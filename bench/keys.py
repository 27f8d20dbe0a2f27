"""Authentication cost of managed keys: instructions per request (valgrind, callgrind)
with the caller's key among 100,000 keys in the embedded key store, against the same
key listed in the policy file, side by side in one run.

Both gateways serve the same policy and load (`bench/instructions.py`'s probe: warm-up,
then the measured requests at concurrency 16); the only difference is where the key
lives. With the policy's key the managed-key view is consulted by no request (the
policy's index answers first) but the spend ledger runs for both. The goal: within 2 %
instructions per request.

    .venv/bin/python bench/keys.py [--keys N] [--requests N] [--rounds N]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.instructions import Probe, count
from bench.loadgen import KEY, free_port, pinned, wait_listening
from bench.overhead import routegate_policy
from gateway.keys.record import KeyRecord
from gateway.keys.sqlite_store import SqliteKeyStore

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _hash(key: str) -> str:
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def fill_store(data_dir: Path, keys: int) -> None:
    """`keys` managed keys of tenant `bench`, the benchmark's own among them (one
    transaction, through the store's own schema)."""
    import asyncio

    async def create_schema() -> None:  # the store's tables, made as the gateway makes them
        store = SqliteKeyStore(data_dir / "keys.sqlite3")
        await store.create(KeyRecord("key_bench", _hash(KEY), "bench", name="bench"))
        await store.aclose()

    asyncio.run(create_schema())
    now = time.time()
    rows = []
    for n in range(keys - 1):
        record = KeyRecord(f"key_{n:012x}", _hash(secrets.token_urlsafe(24)), "bench",
                           name=f"key {n}", labels=("bench",), created_at=now, updated_at=now)
        rows.append((record.id, n + 2, record.to_json()))
    with sqlite3.connect(data_dir / "keys.sqlite3") as db:
        db.executemany("INSERT INTO keys VALUES (?, ?, ?)", rows)
        db.execute("UPDATE meta SET value = ? WHERE name = 'seq'", (keys,))


def managed_policy(upstream: str) -> str:
    """The benchmark policy without the key in `api_keys`: it is a managed key then."""
    text = routegate_policy(upstream)
    return text.replace(f'    api_keys: ["{_hash(KEY)}"]\n', "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("ROUTEGATE_REDIS_URL", None)
    others = "1" if (os.cpu_count() or 1) == 2 else f"1-{(os.cpu_count() or 2) - 1}"
    upstream_port = free_port()
    upstream_process = subprocess.Popen(
        pinned([sys.executable, str(HERE / "overhead.py"), "upstream", "--port",
                str(upstream_port)], others), env=env, cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = Probe("routegate", "routegate")
    results: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory() as work:
        workdir = Path(work)
        try:
            wait_listening(upstream_port, upstream_process)
            upstream = f"http://127.0.0.1:{upstream_port}/v1"
            policy_keys = workdir / "policy-keys.yaml"
            policy_keys.write_text(routegate_policy(upstream))
            managed = workdir / "managed-keys.yaml"
            managed.write_text(managed_policy(upstream))
            (workdir / "empty").mkdir()
            (workdir / "store").mkdir()
            started = time.monotonic()
            fill_store(workdir / "store", args.keys)
            print(f"{args.keys:,} keys written in {time.monotonic() - started:.1f} s")
            for _ in range(args.rounds):
                in_policy = count(probe, upstream, policy_keys, args.requests,
                                  {**env, "ROUTEGATE_DATA_DIR": str(workdir / "empty")})
                in_store = count(probe, upstream, managed, args.requests,
                                 {**env, "ROUTEGATE_DATA_DIR": str(workdir / "store")})
                results.append((in_policy, in_store))
        finally:
            upstream_process.terminate()
            upstream_process.wait(10)
    print(f"\ninstructions per request, {args.requests} requests, {len(results)} round(s)")
    print(f"{'policy-file key':>18}{f'managed key ({args.keys:,} in store)':>36}{'change':>10}")
    for in_policy, in_store in results:
        print(f"{in_policy:>18,}{in_store:>36,}{100 * (in_store / in_policy - 1):>+9.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
