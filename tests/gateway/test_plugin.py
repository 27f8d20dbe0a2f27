"""Plug-ins declare what they provide; the app fixes the hooks once (`gateway/plugin.py`)."""

from __future__ import annotations

import dataclasses

import pytest
from aiohttp import web

from gateway.app import HOOKS, PLUGINS, create_app
from gateway.core.context import Attempt, RequestContext
from gateway.core.drain import Drain
from gateway.core.hooks import NoAdmission
from gateway.plugin import Hooks, HookTaken, Provides, Wiring
from tests.conftest import as_policy, single_backend_policy


class Named:
    def __init__(self, name: str, told: list[str]) -> None:
        self.name, self.told = name, told

    def request_started(self, ctx: RequestContext) -> None:
        self.told.append(self.name)

    def attempt_finished(self, ctx: RequestContext, attempt: Attempt) -> None:
        return None

    def request_finished(self, ctx: RequestContext) -> None:
        return None


def _app(*extra: object) -> web.Application:
    policy = as_policy(single_backend_policy("http://127.0.0.1:9/v1"))
    return create_app(policy, plugins=(*PLUGINS, *extra))  # type: ignore[arg-type]


def test_observers_are_told_in_the_order_the_plugins_are_listed() -> None:
    told: list[str] = []

    def first(wiring: Wiring) -> Provides:
        return Provides(observers=(Named("first", told),))

    def second(wiring: Wiring) -> Provides:
        return Provides(observers=(Named("second", told),))

    hooks = _app(first, second)[HOOKS]
    ours = [observer.name for observer in hooks.observers if isinstance(observer, Named)]
    assert ours == ["first", "second"]
    assert isinstance(hooks.observers[0], Drain)  # the app's own come first


def test_two_plugins_providing_one_hook_is_refused_at_start_up() -> None:
    def another_limiter(wiring: Wiring) -> Provides:
        return Provides(admission=NoAdmission())

    with pytest.raises(HookTaken, match="admission"):
        _app(another_limiter)


def test_the_hooks_are_fixed_once_assembled() -> None:
    hooks = _app()[HOOKS]
    with pytest.raises(dataclasses.FrozenInstanceError):
        hooks.max_attempts = 1  # type: ignore[misc]
    assert isinstance(hooks, Hooks) and hooks.router is not Hooks().router
