"""The copy rule: a draft-free baseline that says how much of a text repeats its context.

At draft position ``t`` the current token is ``ids[t+1]`` and the token to predict ``ids[t+2]``
(the pairing in ``eagle_loss.sequence_inputs``). The rule predicts whatever followed the most
recent earlier occurrence of the current token. A one-layer EAGLE draft cannot express this
(matching a token, then reading its successor, takes two attention layers), so comparing it
with the draft shows how much of a miss is copying the draft's layout cannot do.
"""

from __future__ import annotations

import torch


def copy_rule_guesses(ids: torch.Tensor) -> torch.Tensor:
    """(L,) token ids -> (L-1,) guess per draft position, -1 where the token is new."""
    tokens = ids.tolist()
    last: dict[int, int] = {}
    guesses = []
    for t in range(len(tokens) - 1):
        last[tokens[t]] = t  # occurrences before the current token (index t + 1)
        j = last.get(tokens[t + 1], -1)
        guesses.append(tokens[j + 1] if j >= 0 else -1)
    return torch.tensor(guesses, dtype=torch.long)
