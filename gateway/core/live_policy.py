"""The policy the gateway is running now.

A request reads `live.current` once at its start and keeps that object for its
whole life, so a reload (`swap`) never changes the rules under a request in flight.

A few settings are read once at start-up (the limits store: its connections and the
counters in it cannot move under running requests). Whoever reads one `pin`s it; a
reload that changes a pinned setting still installs the rest of the policy, and
`restart_needed` names what waits for a restart, so the reload reports it instead of
ignoring it.
"""

from __future__ import annotations

from collections.abc import Callable

from policies.load import Policy

Listener = Callable[[Policy], None]


class LivePolicy:
    __slots__ = ("_listeners", "_pinned", "_rechecks", "current")

    def __init__(self, policy: Policy) -> None:
        self.current = policy
        self._listeners: list[Listener] = []
        self._rechecks: list[Listener] = []
        self._pinned: dict[str, tuple[Callable[[Policy], object], object]] = {}

    def on_swap(self, listener: Listener, *, recheck: bool = False) -> None:
        """`listener` sees each new policy; with `recheck`, also the running one when a
        reload finds the file unchanged (files it names, such as CA bundles, may have
        changed under it)."""
        self._listeners.append(listener)
        if recheck:
            self._rechecks.append(listener)

    def swap(self, policy: Policy) -> None:
        """Install an already-validated policy; listeners see it before the next request."""
        self.current = policy
        for listener in self._listeners:
            listener(policy)

    def recheck(self) -> None:
        """A reload found the policy unchanged: tell the listeners that asked."""
        for listener in self._rechecks:
            listener(self.current)

    def pin(self, setting: str, read: Callable[[Policy], object]) -> None:
        """`setting` (a dotted name, e.g. `limits.store`) keeps the value `read` gives
        for the current policy until the process restarts."""
        self._pinned[setting] = (read, read(self.current))

    def restart_needed(self, policy: Policy) -> list[str]:
        """The pinned settings whose value in `policy` differs from the running one."""
        return [setting for setting, (read, running) in self._pinned.items()
                if read(policy) != running]
