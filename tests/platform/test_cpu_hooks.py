"""The CPU hook that runs SGLang's torch.compile'd draft beam step uncompiled."""

from __future__ import annotations

import torch
from torch._dynamo.utils import counters

from sgl_adaspec.adapters.platform.cpu.hooks import eager_on_cpu


def beam_step_args(batch: int, topk: int, hidden: int = 8):
    g = torch.Generator().manual_seed(batch * 10 + topk)
    return (
        2,  # draft step i
        torch.rand(batch * topk, topk, generator=g),  # topk_p
        torch.randint(0, 100, (batch * topk, topk), generator=g),  # topk_index
        torch.rand(batch * topk, hidden, generator=g),  # hidden_states
        torch.rand(batch, topk, generator=g),  # scores
        topk,
    )


def test_the_beam_step_runs_uncompiled_on_cpu_with_sglang_results():
    from sglang.srt.speculative import spec_utils

    compiled = spec_utils._select_top_k_tokens_later
    uncompiled = compiled._torchdynamo_orig_callable  # SGLang's own function
    counters.clear()
    for batch, topk in ((1, 2), (4, 2), (3, 1)):
        args = beam_step_args(batch, topk)
        got = eager_on_cpu(compiled, *args)
        want = uncompiled(*args)
        torch.testing.assert_close(got[:3], want[:3], rtol=0, atol=0)
        for g, w in zip(got[3], want[3]):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert not counters["frames"], "dynamo compiled a frame"


def test_a_function_without_a_compiled_original_is_called_as_is():
    calls = []

    def plain(x):
        calls.append(x)
        return x + 1

    assert eager_on_cpu(plain, torch.zeros(2)).tolist() == [1.0, 1.0]
    assert len(calls) == 1
