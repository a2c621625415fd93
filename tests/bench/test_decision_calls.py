"""benchmarks/decision_calls.py: torch calls per decision, counted."""

from tests.bench import load_benchmark


def test_each_policys_calls_are_counted_and_the_last_line_says_adaserves(capsys):
    bench = load_benchmark("decision_calls")
    assert bench.main(["--requests", "40", "--policies", "adaserve,tetris"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    calls = {line.split(":")[0]: float(line.split()[1]) for line in lines[:-1]}
    assert set(calls) == {"adaserve", "tetris"} and min(calls.values()) > 0
    assert lines[-1] == f"adaserve_torch_calls_per_decision={calls['adaserve']:.1f}"


def _calls(bench, capsys, *flags: str) -> dict[str, float]:
    assert bench.main(["--requests", "40", "--policies", "adaserve,tetris", *flags]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    return {line.split(":")[0]: float(line.split()[1]) for line in lines[:-1]}


def test_on_a_servers_trees_adaserve_runs_no_beam_search_before_the_verify(capsys):
    # The adapter's candidates on a GPU: device tensors, no layout promise. adaserve selects
    # within what the draft ran, as on the simulator's beams; tetris searches each chain.
    bench = load_benchmark("decision_calls")
    simulated, server = _calls(bench, capsys), _calls(bench, capsys, "--server-trees")
    assert server["adaserve"] == simulated["adaserve"]
    assert server["tetris"] > simulated["tetris"]
