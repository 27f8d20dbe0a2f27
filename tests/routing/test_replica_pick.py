"""Which replica serves a request: the one holding the prompt, unless too busy."""

from __future__ import annotations

from policies.fleet_schema import PrefixPick
from routing.replica_pick import ReplicaView, in_service, pick

WEIGHTS = PrefixPick()


def views(*busy: int) -> list[ReplicaView]:
    return [ReplicaView(f"r{i}", outstanding=b) for i, b in enumerate(busy)]


def test_prefix_picks_the_replica_holding_most_of_the_prompt() -> None:
    chosen = pick("prefix", views(0, 1), held={"r1": 10}, blocks=10, weights=WEIGHTS, turn=0)
    assert chosen is not None and (chosen.replica, chosen.reason) == ("r1", "prefix")


def test_a_replica_holding_the_prompt_loses_it_once_far_busier() -> None:
    chosen = pick("prefix", views(0, 9), held={"r1": 10}, blocks=10, weights=WEIGHTS, turn=0)
    assert chosen is not None and chosen.replica == "r0"


def test_a_cold_prompt_goes_to_the_least_busy() -> None:
    chosen = pick("prefix", views(3, 1, 2), held={}, blocks=10, weights=WEIGHTS, turn=0)
    assert chosen is not None and (chosen.replica, chosen.reason) == ("r1", "cold")


def test_busy_counts_what_a_replica_reports_of_other_gateways_too() -> None:
    reported = [ReplicaView("r0", 0, waiting=5, running=4), ReplicaView("r1", 2)]
    chosen = pick("least_busy", reported, held={}, blocks=0, weights=WEIGHTS, turn=0)
    assert chosen is not None and chosen.replica == "r1"


def test_round_robin_takes_each_in_turn() -> None:
    chosen = [pick("round_robin", views(0, 0, 0), held={}, blocks=0, weights=WEIGHTS,
                   turn=turn) for turn in range(4)]
    assert [c.replica for c in chosen if c is not None] == ["r0", "r1", "r2", "r0"]


def test_ejected_replicas_are_left_out_within_the_cap_and_never_all() -> None:
    fleet = [ReplicaView("r0", 0, ejected_until=50.0), ReplicaView("r1", 0, ejected_until=40.0),
             ReplicaView("r2", 0)]
    assert [r.name for r in in_service(fleet, 10.0, max_ejected=1)] == ["r1", "r2"]
    assert [r.name for r in in_service(fleet[:2], 10.0, max_ejected=5)] == ["r1"]
    assert [r.name for r in in_service(fleet, 60.0, max_ejected=1)] == ["r0", "r1", "r2"]


def test_a_cold_prompt_goes_where_the_cache_holds_least_among_the_nearly_idle() -> None:
    chosen = pick("prefix", views(1, 0, 3), held={}, blocks=10, weights=WEIGHTS, turn=0,
                  cache_blocks={"r0": 5, "r1": 40, "r2": 0})
    assert chosen is not None and (chosen.replica, chosen.reason) == ("r0", "cold")
