"""The policy the gateway is running now.

A request reads `live.current` once at its start and keeps that object for its
whole life, so a reload (`swap`) never changes the rules under a request in flight.
"""

from __future__ import annotations

from collections.abc import Callable

from policies.load import Policy

Listener = Callable[[Policy], None]


class LivePolicy:
    __slots__ = ("_listeners", "current")

    def __init__(self, policy: Policy) -> None:
        self.current = policy
        self._listeners: list[Listener] = []

    def on_swap(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def swap(self, policy: Policy) -> None:
        """Install an already-validated policy; listeners see it before the next request."""
        self.current = policy
        for listener in self._listeners:
            listener(policy)
