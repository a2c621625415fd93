"""The demo's verdict per SLO class over its rounds (pure logic; the demo itself runs real
servers)."""

from sgl_adaspec.demo import ClassResult, Outcome


def result(tpots_ms, slo_ms: float = 90.0, baseline_ms: float = 75.0) -> ClassResult:
    rounds = tuple(Outcome("coding", ms, verify_passes=63, verified=()) for ms in tpots_ms)
    return ClassResult(rounds, slo_ms, baseline_ms)


def test_a_class_is_met_when_its_median_tpot_over_the_rounds_is_within_its_slo():
    # One round on a slow host does not fail the class; two do.
    met = result((80, 110, 85))
    assert met.met and met.rounds_met == 2 and met.tpot_ms == 85
    missed = result((80, 110, 95))
    assert not missed.met and missed.rounds_met == 1


def test_a_class_whose_slo_is_below_the_baseline_is_out_of_reach():
    assert not result((80, 80, 80), slo_ms=50.0).reachable
    assert result((80, 80, 80), slo_ms=75.0).reachable
