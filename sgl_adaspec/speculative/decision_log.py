"""An opt-in record of every decode iteration a policy decided (`--spec-decision-log PATH`):
one JSON line per iteration with what ran, what it measured and why the policy chose it.

A stand-down, a probe or a plan that went wrong is otherwise seen only in its sum (the
`/server_info` statistics); the line shows the plan's inputs at the moment it was made (the
fits, the track record, the requests blind to the draft). Pure: an outcome and the policy's
own account in, a line out; nothing is written unless the flag names a file.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TextIO

from sgl_adaspec.speculative.policies.base import Outcome

logger = logging.getLogger(__name__)


def iteration_line(outcome: Outcome, account: dict, wall_time_s: float, dp_rank: int = 0) -> str:
    """One iteration of DP replica `dp_rank` as a JSON line: its outcome (requests, the draft
    shape that ran, verified and committed tokens, times in ms) and the policy's `account` of
    its choice."""
    accepted = None if outcome.accepted is None else int(outcome.accepted.sum())
    record = {
        "time_s": round(wall_time_s, 4),
        "dp_rank": dp_rank,
        "requests": len(outcome.rids),
        "draft": [outcome.draft_depth, outcome.draft_width],
        "verified": int(outcome.verified.sum()),
        "committed": accepted,
        "iteration_ms": round(outcome.iteration_ms, 3),
        "verify_ms": round(outcome.verify_ms, 3),
        "stall_ms": round(outcome.stall_ms, 3),
        "after_prefill": outcome.after_prefill,
        # Per request: tokens verified and committed, and f of each verified node (0 for the
        # others): what a replayed draft must reproduce of an eager one.
        "verified_per_request": outcome.verified.tolist(),
        "committed_per_request": None if outcome.accepted is None else outcome.accepted.tolist(),
        "verified_f": (
            None
            if outcome.verified_f is None
            else [[round(f, 4) for f in row] for row in outcome.verified_f.tolist()]
        ),
        **account,
    }
    return json.dumps(record, separators=(",", ":"))


class DecisionLog:
    """Appends `iteration_line`s to a file, flushed per line so that a server that is killed
    loses nothing already decided (under --dp each replica appends whole lines to the same
    file, told apart by `dp_rank`)."""

    def __init__(self, path: str | Path, dp_rank: int = 0) -> None:
        self.path = Path(path)
        self.dp_rank = dp_rank
        self._file: TextIO | None = self.path.open("a", encoding="utf-8", buffering=1)

    def write(self, outcome: Outcome, account: dict) -> None:
        """One line; a file that can no longer be written (a full disk) ends the log, with a
        warning, not the serving."""
        if self._file is None:
            return
        try:
            line = iteration_line(outcome, account, time.time(), self.dp_rank)
            self._file.write(line + "\n")
        except OSError as exc:
            logger.warning("sgl_adaspec: decision log %s stopped: %s", self.path, exc)
            self.close()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
