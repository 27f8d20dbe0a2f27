"""Process settings: what is not policy (where to listen, how to start children)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path


def default_policy_path() -> Path:
    """`policies/default.yaml` from the installed package, wherever the CWD is."""
    return Path(str(resources.files("policies").joinpath("default.yaml")))


def package_version() -> str:
    """The installed distribution's version (`routegate --version`)."""
    try:
        return metadata.version("routegate")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


@dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    policy_path: Path | None = None
    watch_policy: bool = True  # reload `policy_path` when it changes (also SIGHUP, admin API)
    shadow_policy_path: Path | None = None  # decide every request under this one too; compare
    # The command that starts a local backend; `--model/--host/--port` and the policy's
    # `launch.args` are appended. Tests substitute a small stand-in program.
    launch_command: tuple[str, ...] = field(
        default_factory=lambda: (sys.executable, "-m", "local_backend"))
    supervise: bool = True  # start `launch:` backends as children
    restart_backoff_s: tuple[float, float] = (0.5, 30.0)  # first delay, cap
    # `serve --workers N`: this process is one of `workers` on one port (SO_REUSEPORT);
    # each backend's `max_concurrency` is shared out among them; launched backends are
    # the supervisor's, read from `launch_board` (gateway/launch/board.py).
    workers: int = 1
    reuse_port: bool = False
    launch_board: Path | None = None
    # a deployment's Redis (`ROUTEGATE_REDIS_URL`): over the policy's `limits.store`
    redis_url: str | None = field(
        default_factory=lambda: os.environ.get("ROUTEGATE_REDIS_URL") or None)
    # Where managed keys (SQLite), their spend and the audit log live (`serve`: from
    # ROUTEGATE_DATA_DIR); None: keys and spend in memory, no audit file (tests)
    data_dir: Path | None = None


def default_data_dir(environ: Mapping[str, str]) -> Path:
    """`ROUTEGATE_DATA_DIR`, else ~/.local/state/routegate (`routegate serve`)."""
    value = environ.get("ROUTEGATE_DATA_DIR")
    return Path(value) if value else Path.home() / ".local/state/routegate"
