"""The draft tiers' build stops at its memory and time caps (`--draft-tier-memory-gb`,
`--draft-tier-capture-s`): the tier that crosses a cap is kept, none after it is built. SGLang's
builder is replaced by one that takes 1 GB and 10 s a tier."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sgl_adaspec.adapters.speculative import tier_states

SHAPES = ((4, 2), (0, 2), (1, 1), (2, 1), (2, 2), (3, 2))


@pytest.fixture
def cost_per_tier(monkeypatch):
    """Each build takes 1 GB of device memory and 10 s; the configured state holds graphs."""
    clock = SimpleNamespace(now=0.0, free_gb=40.0, built=[])

    def build(worker, shape, num_draft_tokens):
        clock.now += 10.0
        clock.free_gb -= 1.0
        clock.built.append(shape)
        return SimpleNamespace(shape=shape)

    monkeypatch.setattr(tier_states, "_build", build)
    monkeypatch.setattr(
        tier_states, "_current_state", lambda worker: SimpleNamespace(
            cuda_graph_runner=object(), target_graph_runner=None,
            cuda_graph_runner_for_draft_extend=None,
        ),
    )  # fmt: skip
    import sglang.srt.utils

    monkeypatch.setattr(sglang.srt.utils, "get_available_gpu_memory", lambda *a: clock.free_gb)
    return clock


def worker():
    return SimpleNamespace(
        speculative_num_steps=4, topk=2, speculative_num_draft_tokens=8, device="cuda", gpu_id=0,
        build_adaptive_runtime_state=None,
    )  # fmt: skip


@pytest.mark.parametrize(
    "caps, built",
    [
        ({}, 5),
        ({"memory_cap_gb": 2.5}, 3),  # 3 GB crosses 2.5: kept, then stop
        ({"time_cap_s": 15.0}, 2),  # 20 s crosses 15
        ({"memory_cap_gb": 10.0, "time_cap_s": 35.0}, 4),
    ],
)
def test_tiers_stop_at_the_first_cap_crossed(cost_per_tier, caps, built):
    tiers = tier_states.build_tier_states(
        worker(), SHAPES, clock=lambda: cost_per_tier.now, **caps
    )
    assert cost_per_tier.built == list(SHAPES[1 : 1 + built])
    assert list(tiers.states) == [SHAPES[0], *SHAPES[1 : 1 + built]]
    assert tiers.memory_gb == pytest.approx(float(built))
