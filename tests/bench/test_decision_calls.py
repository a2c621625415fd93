"""benchmarks/decision_calls.py: torch calls per decision, counted."""

from tests.bench import load_benchmark


def _calls(bench, capsys, *flags: str) -> tuple[dict[str, float], str]:
    """Calls per decision by policy, and the last line."""
    assert bench.main(["--requests", "40", "--policies", "adaserve,tetris", *flags]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return {line.split(":")[0]: float(line.split()[1]) for line in lines[:-1]}, lines[-1]


def test_each_policys_calls_are_counted_and_the_last_line_says_adaserves(capsys):
    calls, last = _calls(load_benchmark("decision_calls"), capsys)
    assert set(calls) == {"adaserve", "tetris"} and min(calls.values()) > 0
    assert last == f"adaserve_torch_calls_per_decision={calls['adaserve']:.1f}"


def test_on_a_servers_trees_adaserve_runs_no_beam_search_before_the_verify(capsys):
    # The adapter's candidates on a GPU: device tensors, no layout promise. adaserve selects
    # within what the draft ran, as on the simulator's beams; tetris searches each chain.
    bench = load_benchmark("decision_calls")
    simulated, _ = _calls(bench, capsys)
    server, _ = _calls(bench, capsys, "--server-trees")
    assert server["adaserve"] == simulated["adaserve"]
    assert server["tetris"] > simulated["tetris"]
