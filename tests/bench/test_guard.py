"""The hot path's regression guard judges ratios to the bare proxy against a baseline."""

from bench.guard import GUARDED, lower_of, ratios, regressions
from bench.instructions import PROBES


def test_each_probe_is_divided_by_the_bare_proxy_of_its_own_kind() -> None:
    counts = {"bare proxy": 500_000, "bare proxy stream": 600_000, "routegate": 1_000_000,
              "routegate stream": 1_500_000, "routegate traced": 1_200_000,
              "routegate redis": 1_400_000}
    assert ratios(counts) == {"routegate": 2.0, "routegate stream": 2.5,
                              "routegate traced": 2.4, "routegate redis": 2.8}


def test_growth_within_the_tolerance_passes_and_past_it_fails_naming_the_probe() -> None:
    baseline = {"routegate": 2.0, "routegate stream": 2.5}
    assert regressions({"routegate": 2.09, "routegate stream": 2.4}, baseline, 0.05) == []
    [line] = regressions({"routegate": 2.11, "routegate stream": 2.5}, baseline, 0.05)
    assert line.startswith("routegate: 2.110×") and "+5.5 %" in line


def test_a_probe_without_a_baseline_fails_rather_than_passing_unseen() -> None:
    [line] = regressions({"routegate redis": 1.0}, {}, 0.05)
    assert "no baseline" in line


def test_every_guarded_probe_is_compared_with_a_bare_proxy_that_is_measured() -> None:
    for name in GUARDED:
        assert PROBES[PROBES[name].baseline].server == "bare proxy"


def test_the_redis_probe_has_its_wider_band_and_no_other_probe_does() -> None:
    baseline = {"routegate redis": 2.0, "routegate": 2.0}
    assert regressions({"routegate redis": 2.2, "routegate": 2.0}, baseline, 0.05) == []
    assert len(regressions({"routegate redis": 2.3, "routegate": 2.11}, baseline, 0.05)) == 2


def test_a_probe_measured_twice_is_judged_by_its_lower_run() -> None:
    first = {"routegate": 2.2, "routegate redis": 2.9}
    assert lower_of(first, {"routegate redis": 2.4}) == {"routegate": 2.2,
                                                          "routegate redis": 2.4}
    baseline = {"routegate": 2.0, "routegate redis": 2.3}
    assert [line.split(":")[0] for line in regressions(
        lower_of(first, {"routegate redis": 2.4}), baseline, 0.05)] == ["routegate"]
