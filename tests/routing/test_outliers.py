"""Outlier ejection: failures in a row eject a target, a probe brings it back, a cap holds."""

from __future__ import annotations

import dataclasses

from routing.decide import Router, max_ejected
from routing.outliers import Ejections
from routing.stats import LiveStats
from tests.routing.policies import policy
from tests.routing.test_decide import REQUEST, keys, reasons

KEY = "local/llama"
SETTINGS = policy().file.resilience.outlier_detection.model_copy(update={
    "consecutive_failures": 3, "base_ejection_s": 10.0, "max_ejection_s": 25.0})


def ejected_after_failures(now: float = 0.0) -> tuple[LiveStats, Ejections]:
    stats = LiveStats()
    ejections = Ejections(stats)
    for _ in range(SETTINGS.consecutive_failures):
        ejections.failed(KEY, now, SETTINGS)
    return stats, ejections


def test_failures_in_a_row_eject_the_target_for_the_base_time() -> None:
    stats, ejections = ejected_after_failures()
    assert stats.snapshot().ejected == {KEY: 10.0}
    assert ejections.state(KEY, 5.0) == "ejected"


def test_a_success_between_failures_starts_the_count_again() -> None:
    stats = LiveStats()
    ejections = Ejections(stats)
    for _ in range(SETTINGS.consecutive_failures - 1):
        ejections.failed(KEY, 0.0, SETTINGS)
    ejections.succeeded(KEY, 0.0)
    assert not ejections.failed(KEY, 0.0, SETTINGS)
    assert stats.snapshot().ejected == {}


def test_once_the_time_is_up_one_attempt_probes_while_the_rest_stay_away() -> None:
    stats, ejections = ejected_after_failures()
    ejections.attempt_started(KEY, 11.0, SETTINGS)
    assert ejections.state(KEY, 11.0) == "probing"
    assert stats.snapshot().ejected[KEY] > 11.0  # still out for every other decision
    assert ejections.succeeded(KEY, 11.5)
    assert stats.snapshot().ejected == {} and ejections.state(KEY, 11.5) == "in_service"


def test_a_failed_probe_ejects_again_for_longer_up_to_the_maximum() -> None:
    stats, ejections = ejected_after_failures()
    ejections.attempt_started(KEY, 11.0, SETTINGS)
    assert ejections.failed(KEY, 11.0, SETTINGS)
    assert stats.snapshot().ejected == {KEY: 31.0}  # 2 × 10 s
    ejections.attempt_started(KEY, 32.0, SETTINGS)
    ejections.failed(KEY, 32.0, SETTINGS)
    assert stats.snapshot().ejected == {KEY: 57.0}  # 3 × 10 s, capped at 25 s


def test_a_late_failure_of_a_request_sent_before_the_ejection_changes_nothing() -> None:
    stats, ejections = ejected_after_failures()
    assert not ejections.failed(KEY, 1.0, SETTINGS)
    assert stats.snapshot().ejected == {KEY: 10.0}


def test_disabled_outlier_detection_never_ejects() -> None:
    stats = LiveStats()
    ejections = Ejections(stats)
    off = SETTINGS.model_copy(update={"enabled": False})
    for _ in range(10):
        ejections.failed(KEY, 0.0, off)
    assert stats.snapshot().ejected == {}


def test_routing_leaves_an_ejected_target_out_and_says_why() -> None:
    stats, _ = ejected_after_failures()
    decision = Router(policy()).decide(REQUEST, stats.snapshot(), 5.0)
    assert KEY not in keys(decision) and reasons(decision) == {KEY: "ejected"}
    assert "5.0 s more" in decision.excluded[0].detail


def test_routing_takes_an_ejected_target_back_once_its_time_is_up() -> None:
    stats, _ = ejected_after_failures()
    assert KEY in keys(Router(policy()).decide(REQUEST, stats.snapshot(), 10.0))


def test_max_ejection_percent_keeps_the_soonest_back_in_service() -> None:
    stats = LiveStats()
    stats.eject("local/llama", until=50.0)
    stats.eject("openai/gpt-4o-mini", until=20.0)
    stats.eject("anthropic/haiku", until=30.0)
    # 3 targets at 50 %: one may be out at a time, the one out the longest
    decision = Router(policy()).decide(REQUEST, stats.snapshot(), 5.0)
    assert keys(decision) == ["openai/gpt-4o-mini", "anthropic/haiku"]
    assert reasons(decision) == {"local/llama": "ejected"}


def test_a_route_never_ejects_all_of_its_targets() -> None:
    assert max_ejected(1, 100) == 0
    assert max_ejected(2, 100) == 1
    assert max_ejected(2, 10) == 1  # at least one, as Envoy
    assert max_ejected(10, 50) == 5
    assert max_ejected(10, 0) == 0


def test_ejection_never_takes_a_tenants_last_compliant_target() -> None:
    stats, _ = ejected_after_failures()
    eu = dataclasses.replace(REQUEST, tenant="acme", tenant_tags=frozenset({"eu"}))
    router = Router(policy())
    decision = router.decide(eu, stats.snapshot(), 5.0)
    assert keys(decision) == [KEY]  # out for everyone else, still acme's
    assert KEY not in keys(router.decide(REQUEST, stats.snapshot(), 5.0))
    assert router.sole_targets() == {KEY: ["acme on chat"]}


def test_a_passing_health_check_is_the_probe_once_the_ejection_time_is_up() -> None:
    stats, ejections = ejected_after_failures()
    ejections.check_passed(KEY, 5.0, back_up=True)
    assert ejections.state(KEY, 5.0) == "ejected"  # not before its time
    ejections.check_passed(KEY, 11.0, back_up=True)
    assert ejections.state(KEY, 11.0) == "in_service" and stats.snapshot().ejected == {}


def test_a_failing_health_check_after_the_ejection_time_ejects_again_for_longer() -> None:
    stats, ejections = ejected_after_failures()
    ejections.check_failed(KEY, 11.0, SETTINGS, down=False)
    assert stats.snapshot().ejected == {KEY: 31.0}


def test_health_checks_take_a_target_down_until_they_pass_again() -> None:
    stats = LiveStats()
    ejections = Ejections(stats)
    ejections.check_failed(KEY, 0.0, SETTINGS, down=True)
    assert ejections.state(KEY, 0.0) == "unhealthy"
    assert not stats.snapshot().target(KEY).healthy(1e9)
    ejections.check_passed(KEY, 1.0, back_up=False)
    assert ejections.state(KEY, 1.0) == "unhealthy"
    ejections.check_passed(KEY, 2.0, back_up=True)
    assert ejections.state(KEY, 2.0) == "in_service" and stats.snapshot().target(KEY).healthy(2.0)


def test_errors_below_consecutive_failures_never_take_a_target_out_of_routing() -> None:
    # the retired error-rate breaker excluded a target after its second error in a row
    stats = LiveStats()
    ejections = Ejections(stats)
    stats.record_success(KEY, network_ms=None, ttft_ms=None, total_ms=None, output_tokens=0)
    for second in range(SETTINGS.consecutive_failures - 1):
        stats.record_error(KEY, float(second))
        ejections.failed(KEY, float(second), SETTINGS)
    decision = Router(policy()).decide(REQUEST, stats.snapshot(), 3.0)
    assert KEY in keys(decision) and KEY not in reasons(decision)


def test_the_percent_cap_holds_when_every_target_fails_at_once() -> None:
    stats = LiveStats()
    ejections = Ejections(stats)
    everyone = keys(Router(policy()).decide(REQUEST, stats.snapshot(), 0.0))
    for key in everyone:
        for _ in range(10):
            stats.record_error(key, 0.0)
            ejections.failed(key, 0.0, SETTINGS)
    decision = Router(policy()).decide(REQUEST, stats.snapshot(), 1.0)
    out = [key for key, reason in reasons(decision).items() if reason == "ejected"]
    assert len(out) == max_ejected(len(everyone), SETTINGS.max_ejection_percent)
    assert len(keys(decision)) == len(everyone) - len(out) > 0


def test_a_forgotten_target_leaves_nothing_behind() -> None:
    stats, ejections = ejected_after_failures()
    ejections.check_failed("gone/m", 0.0, SETTINGS, down=True)
    ejections.forget(KEY)
    ejections.forget("gone/m")
    assert ejections.report(1.0) == {} and stats.snapshot().ejected == {}
    assert stats.snapshot().targets == {}
