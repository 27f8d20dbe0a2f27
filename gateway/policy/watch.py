"""Hot reload of the policy file: file watch, SIGHUP and `POST /admin/policy/reload`.

Whatever the trigger, a reload reads and validates the whole file off the event
loop, and only then installs it with one reference assignment (`LivePolicy.swap`).
Each request reads `live.current` once at its start, so requests in flight finish
under the policy they started with and none can see a half-loaded one. An
invalid file leaves the running policy untouched; the failure is logged once
(per distinct error), counted in `routegate_policy_reloads_total{result}`, and
shown by `GET /admin/policy`. A valid file that changes a setting read only at
start-up (`LivePolicy.pin`: the limits store) is installed all the same, and the
result, the log and `GET /admin/policy` name the settings that wait for a restart.

Connection pools need no work here: `UpstreamPool` compares each backend's spec
on use, so an unchanged backend keeps its pool and a changed one gets a new one.
A reload that finds the file unchanged still rechecks what the policy points at: a
rotated `ca_file` gets its backend fresh connections that trust the new bundle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import watchfiles
from aiohttp import web

from gateway.core.live_policy import LivePolicy
from policies.errors import PolicyError
from policies.load import Policy, load

log = logging.getLogger("routegate.policy")

WATCH_DEBOUNCE_MS = 200  # editors write a file in several steps; wait for the last one
# How often the watcher's thread wakes, takes the GIL and looks at what inotify gathered;
# a change is acted on one to two steps after it. At watchfiles' default of 50 ms an idle
# gateway woke 20 times a second for it (1.4 ms of CPU a second, and as many GIL
# hand-offs to a serving event loop).
WATCH_STEP_MS = 200


class CounterLike(Protocol):
    def labels(self, *values: str) -> Any: ...


@dataclass(frozen=True, slots=True)
class ReloadResult:
    result: str  # "ok" | "invalid"
    changed: bool  # False when the file's content (version hash) is what already runs
    trigger: str  # "file" | "signal" | "api" | …
    version_hash: str
    error: PolicyError | None = None
    restart_needed: tuple[str, ...] = ()  # changed settings the running process keeps

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"result": self.result, "changed": self.changed,
                                "trigger": self.trigger, "version_hash": self.version_hash,
                                "restart_needed": list(self.restart_needed)}
        if self.error is not None:
            body["errors"] = [issue.as_dict() for issue in self.error.issues]
        return body


class PolicyReloader:
    """Loads the policy file again on request and swaps it in when it is valid."""

    def __init__(self, live: LivePolicy, path: Path, *, reloads: CounterLike,
                 environ: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.live = live
        self.path = path
        self._reloads = reloads
        self._environ = environ
        self._clock = clock
        self._lock = asyncio.Lock()  # one reload at a time: the last file read wins
        self._pending = asyncio.Event()
        self._pending_trigger = "file"
        self.loaded_at = clock()
        self.last_error: PolicyError | None = None
        self.last_error_at: float | None = None
        self.last_attempt: ReloadResult | None = None

    async def reload(self, trigger: str) -> ReloadResult:
        async with self._lock:
            current = self.live.current
            try:
                # Reading and validating a file is blocking work: keep it off the loop.
                policy: Policy = await asyncio.to_thread(load, self.path, environ=self._environ)
            except PolicyError as exc:
                result = ReloadResult("invalid", False, trigger, current.version_hash, exc)
                if self.last_error is None or str(self.last_error) != str(exc):
                    log.error("policy reload (%s) rejected; still running version %s:\n%s",
                              trigger, current.version_hash, exc)
                self.last_error, self.last_error_at = exc, self._clock()
            else:
                changed = policy.version_hash != current.version_hash
                if changed:
                    self.live.swap(policy)
                    self.loaded_at = self._clock()
                    log.info("policy %s loaded from %s (%s)", policy.version_hash,
                             self.path, trigger)
                    for warning in policy.warnings:
                        log.warning("policy warning: %s", warning.render())
                else:
                    self.live.recheck()  # e.g. a CA bundle rotated, then SIGHUP
                    log.info("policy unchanged (%s): still running version %s from %s",
                             trigger, current.version_hash, self.path)
                restart = tuple(self.live.restart_needed(policy))
                if changed and restart:
                    log.warning("policy %s changes %s, read only at start-up: the running "
                                "values stay until the gateway restarts", policy.version_hash,
                                ", ".join(restart))
                self.last_error = self.last_error_at = None
                result = ReloadResult("ok", changed, trigger, self.live.current.version_hash,
                                      restart_needed=restart)
            self._reloads.labels(result.result).inc()
            self.last_attempt = result
            return result

    def request_reload(self, trigger: str) -> None:
        """Ask for a reload soon (signal handlers, watchers); bursts collapse into one."""
        self._pending_trigger = trigger
        self._pending.set()

    def status(self) -> dict[str, Any]:
        """What `GET /admin/policy` shows."""
        policy = self.live.current
        error = self.last_error
        return {
            "version_hash": policy.version_hash,
            "source": policy.source,
            "path": str(self.path),
            "loaded_at": self.loaded_at,
            "warnings": [issue.as_dict() for issue in policy.warnings],
            "restart_needed": self.live.restart_needed(policy),
            "last_error": None if error is None else {
                "at": self.last_error_at, "message": str(error),
                "issues": [issue.as_dict() for issue in error.issues]},
            "last_attempt": None if self.last_attempt is None else self.last_attempt.to_dict(),
            "targets": sorted(policy.targets),
            "routes": sorted(policy.routes),
            "tenants": sorted(policy.file.tenants),
        }

    async def serve_requests(self) -> None:
        """Run reloads asked for by `request_reload`, one after another, until cancelled."""
        while True:
            await self._pending.wait()
            self._pending.clear()
            await self.reload(self._pending_trigger)

    async def watch_file(self, *, debounce_ms: int = WATCH_DEBOUNCE_MS,
                         force_polling: bool | None = None) -> None:
        """Reload when the file changes. The directory is watched, not the file, because
        editors and Kubernetes ConfigMaps replace the file by renaming a new one over it.
        It is the directory the path names, not the one its symlinks lead to: a ConfigMap
        update swaps the `..data` symlink there and deletes the directory the file
        resolved to, so a watch on that one would see no later update. A symlink to a
        file elsewhere gets that file's directory watched too."""
        path = self.path.absolute()
        directories = [path.parent]
        resolved_parent = path.resolve().parent
        if not resolved_parent.is_relative_to(path.parent.resolve()):
            directories.append(resolved_parent)

        def concerns_the_file(_change: watchfiles.Change, changed: str) -> bool:
            changed_path = Path(changed)
            # A ConfigMap swaps the `..data` symlink; the file's resolved target moves.
            return changed_path == path or changed_path.name.startswith("..") or (
                changed_path.resolve() == path.resolve())

        async for _changes in watchfiles.awatch(
                *directories, watch_filter=concerns_the_file, debounce=debounce_ms,
                step=WATCH_STEP_MS, force_polling=force_polling, recursive=False):
            self.request_reload("file")


def reload_context(reloader: PolicyReloader, *, watch: bool = True, sighup: bool = True
                   ) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    """An `app.cleanup_ctx` entry that owns the watcher, the SIGHUP handler and the
    reload loop for the app's lifetime."""

    @contextlib.asynccontextmanager
    async def context(_app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        tasks = [asyncio.create_task(reloader.serve_requests(), name="policy-reload")]
        if watch:
            tasks.append(asyncio.create_task(reloader.watch_file(), name="policy-watch"))
        handled_signal = False
        if sighup and hasattr(signal, "SIGHUP"):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signal.SIGHUP, reloader.request_reload, "signal")
                handled_signal = True
        try:
            yield
        finally:
            if handled_signal:
                loop.remove_signal_handler(signal.SIGHUP)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    return context
