"""The audit log: one JSON line per admin action — who (which admin key, by a hash
prefix or a managed key's id), what, when, from where, the key before and after — in a
file of its own, rotated by size, and counted in metrics. Never a secret: records are
written as the admin API shows them (no key, no hash).
"""

from __future__ import annotations

import logging
import time
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter

from gateway.core.log_text import escaped


class AuditLog:
    def __init__(self, path: Path | None, *, max_bytes: int, backups: int,
                 registry: CollectorRegistry | None = None) -> None:
        """`path` None: actions are counted, not written (tests that do not read it)."""
        self.path = path
        # a logger of its own, outside logging's tree: no other handler sees these lines,
        # and two apps in one process keep two files
        self._logger = logging.Logger("routegate.audit", logging.INFO)
        self._handler: RotatingFileHandler | None = None
        if path is not None:
            self._handler = RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups,
                                                encoding="utf-8", delay=True)
            self._logger.addHandler(self._handler)
        self.actions = Counter("routegate_admin_actions", "Admin API actions, by outcome.",
                               ["action", "outcome"], registry=registry)

    def write(self, *, who: str, action: str, outcome: str, remote: str | None,
              target: str | None = None, before: dict[str, Any] | None = None,
              after: dict[str, Any] | None = None, detail: str | None = None) -> None:
        self.actions.labels(action, outcome).inc()
        if self._handler is None:
            return
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        line: dict[str, Any] = {"ts": round(time.time(), 3), "who": who, "action": action,
                                "outcome": outcome, "remote": remote, "target": target}
        if before is not None:
            line["before"] = before
        if after is not None:
            line["after"] = after
        if detail is not None:
            line["detail"] = escaped(detail)
        self._logger.info(orjson.dumps(line).decode())

    def close(self) -> None:
        if self._handler is not None:
            self._logger.removeHandler(self._handler)
            self._handler.close()
