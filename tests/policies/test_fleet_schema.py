"""A fleet in the policy file: replicas by launch, urls or DNS, and how one is picked."""

from __future__ import annotations

import pytest

from policies import PolicyError, loads

HEAD = "version: 1\nbackends:\n  local:\n    type: openai\n    deployment: dedicated\n"
MODELS = "    models: {m: {}}\n"


def test_listed_replicas_pick_by_prefix_unless_told_otherwise() -> None:
    policy = loads(HEAD + "    urls: [http://10.0.0.5:8000/v1, http://10.0.0.6:8000/v1]\n"
                   + MODELS)
    backend = policy.file.backends["local"]
    assert backend.pick == "prefix" and len(backend.urls) == 2
    assert backend.fleet.prefix.cached_weight == 4.0


def test_launched_replicas_are_counted() -> None:
    policy = loads(HEAD + "    launch: {model: demo, replicas: 3}\n" + MODELS)
    launch = policy.file.backends["local"].launch
    assert launch is not None and launch.replicas == 3


@pytest.mark.parametrize(("lines", "words"), [
    ("    resolve: all\n    urls: [http://a:1/v1]\n", "`resolve: all` needs a `url`"),
    ("    url: http://a:1/v1\n    urls: [http://b:1/v1]\n", "one of `url`, `urls`"),
    ("    urls: [ftp://a/v1]\n", "each of `urls`"),
    ("    url: http://a:1/v1\n    pick: fastest\n", "pick"),
])
def test_a_fleet_written_wrong_is_refused_naming_why(lines: str, words: str) -> None:
    with pytest.raises(PolicyError) as raised:
        loads(HEAD + lines + MODELS)
    assert words in str(raised.value)
