"""`python -m sgl_adaspec.bench.sglang_serving` (`make bench-serving`): a bad input is one
`error:` line and exit code 2 before any server starts (they were tracebacks: a missing draft
folder reached SGLang as a model hub id)."""

from __future__ import annotations

import pytest

from sgl_adaspec.bench.sglang_serving import parse_args


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--draft", "/nonexistent/draft"], "--draft /nonexistent/draft: no such folder"),
        (["--rates", "x"], "expected comma-separated numbers, got 'x'"),
        (["--rates=-1,2"], "--rates must be request rates > 0"),
        (["--rates=inf"], "--rates must be request rates > 0"),
        (["--policies", "fastest"], "unknown --spec-policy 'fastest'"),
        (["--policies", ","], "--policies names no policy"),
        (["--slo-class", "nosuch"], "'nosuch' is not a class the servers serve by"),
        (["--num-prompts", "0"], "--num-prompts must be >= 1, got 0"),
        (["--output-len", "0"], "--output-len must be >= 1, got 0"),
        (["--spec-topk", "1"], "needs --speculative-eagle-topk >= 2 (got 1)"),
        (["--spec-draft-tokens", "40"], "must be 2 to 15 with --speculative-num-steps 4"),
    ],
)  # fmt: skip
def test_bad_inputs_are_one_error_line(flags, message, tmp_path, capsys):
    draft = tmp_path / "draft"
    draft.mkdir()
    with pytest.raises(SystemExit) as exited:
        parse_args(["--model-path", str(tmp_path), "--draft", str(draft), *flags])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and ": error: " in err[-1]  # argparse's one line


def test_good_inputs_parse(tmp_path):
    bench = parse_args(
        ["--model-path", str(tmp_path), "--draft", str(tmp_path), "--rates", "1,4",
         "--policies", "adaserve,tetris", "--slo-class", "chat"]
    )  # fmt: skip
    assert bench.rates == (1.0, 4.0) and bench.policies == ("adaserve", "tetris")
    assert parse_args(["--model-path", "org/model", "--draft", "org/draft"]).draft.name == "draft"
