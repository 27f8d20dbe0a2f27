"""Reading a replica's prefix-event log into the index: stored names are held, evicted
ones are not, a reset replaces what the replica held, and a malformed page (whatever
its shape) changes nothing."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from gateway.route.prefix_events import apply
from gateway.route.replicas import Fleet
from policies.load import loads

POLICY = orjson.dumps({
    "version": 1,
    "backends": {"local": {"type": "openai", "deployment": "dedicated",
                           "urls": ["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"],
                           "models": {"demo": {}},
                           "fleet": {"prefix": {"precise": True}}}},
    "routes": {"chat": {"targets": ["local/demo"]}}}).decode()


def fleet() -> Fleet:
    backend = loads(POLICY).file.backends["local"]
    out = Fleet("local", backend)
    out.set_urls({"r1": "http://127.0.0.1:1/v1", "r2": "http://127.0.0.1:2/v1"}, "urls")
    return out


def page(events: list[list[Any]], next_: int, **extra: Any) -> dict[str, Any]:
    return {"epoch": "life-1", "next": next_, "events": events, **extra}


def test_stored_names_are_held_and_evicted_ones_are_not() -> None:
    f = fleet()
    assert f.precise
    assert apply(f, f.replicas["r1"], page([[1, "00000000000000aa"], [1, "00000000000000bb"],
                                             [0, "00000000000000aa"]], 3))
    assert f.index.matched([0xbb]) == {"r1": 1}
    assert f.index.matched([0xaa]) == {}
    assert (f.replicas["r1"].events_epoch, f.replicas["r1"].events_next) == ("life-1", 3)


def test_a_reset_replaces_all_the_replica_held_and_nothing_of_the_others() -> None:
    f = fleet()
    f.index.record([0x1, 0x2], "r1")
    f.index.record([0x1], "r2")
    assert apply(f, f.replicas["r1"], page([], 9, reset=True, held=["0000000000000003"]))
    assert f.index.matched([0x1]) == {"r2": 1}
    assert f.index.matched([0x3]) == {"r1": 1}
    assert f.index.held["r1"] == 1


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4), max_leaves=12)
pages = st.one_of(json_values, st.fixed_dictionaries(
    {"epoch": json_values, "next": json_values, "events": json_values},
    optional={"reset": json_values, "held": json_values}))


@given(pages)
def test_a_malformed_page_changes_nothing(bad: Any) -> None:
    f = fleet()
    f.index.record([0x1], "r1")
    before = (f.index.matched([0x1]), dict(f.index.held), f.replicas["r1"].events_next)
    if not apply(f, f.replicas["r1"], bad):
        assert (f.index.matched([0x1]), dict(f.index.held),
                f.replicas["r1"].events_next) == before
