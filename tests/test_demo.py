"""The demo's verdict per SLO class over its rounds (pure logic; the demo itself runs real
servers)."""

from sgl_adaspec.demo import ClassResult, Outcome, attainment_lines


def result(
    tpots_ms, slo_ms: float = 90.0, baseline_ms: float = 75.0, slowest_ms: float | None = None
) -> ClassResult:
    rounds = tuple(Outcome("coding", ms, verify_passes=63, verified=()) for ms in tpots_ms)
    slowest_ms = baseline_ms if slowest_ms is None else slowest_ms
    return ClassResult(rounds, slo_ms, baseline_ms, slowest_ms)


def test_a_class_is_met_when_its_median_tpot_over_the_rounds_is_within_its_slo():
    # One round on a slow host does not fail the class; two do.
    met = result((80, 110, 85))
    assert met.met and met.rounds_met == 2 and met.tpot_ms == 85
    missed = result((80, 110, 95))
    assert not missed.met and missed.rounds_met == 1


def test_a_class_whose_slo_is_below_the_baseline_is_out_of_reach():
    assert not result((80, 80, 80), slo_ms=50.0).reachable
    assert result((80, 80, 80), slo_ms=75.0).reachable


def test_a_class_whose_slo_a_baseline_measurement_missed_is_out_of_reach():
    # Plain decoding met 50 ms in the median measurement but not in the slowest one: whether
    # the class is met would be the host's drift, not the policy.
    assert not result((51, 51, 51), slo_ms=50.0, baseline_ms=49.6, slowest_ms=50.8).reachable
    assert result((51, 51, 51), slo_ms=51.0, baseline_ms=49.6, slowest_ms=50.8).reachable


def test_the_attainment_judges_only_the_classes_in_reach_and_says_when_none_is():
    met, missed, out_of_reach = result((80, 80, 80)), result((95, 95, 95)), result((80,), 50.0)
    assert attainment_lines([met, missed, out_of_reach]) == ["slo_attainment=0.50"]
    assert attainment_lines([met, out_of_reach]) == ["slo_attainment=1.00"]
    lines = attainment_lines([out_of_reach])
    assert "none is judged" in lines[0] and lines[-1] == "slo_attainment=1.00"
