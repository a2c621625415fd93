"""The knee rule's tree shape (AdaServe eq. 8-9, `adaserve.knee_shape`): tree depth and beam
width from the number of running requests."""

from __future__ import annotations

import pytest

from sgl_adaspec.speculative.adaserve.knee_shape import (
    AdaptiveTreeConfig,
    beam_width,
    tree_depth,
    tree_shape,
)


@pytest.mark.parametrize(
    "num_requests, depth",
    # floor(256 / n) - 1 clipped to [1, 8]
    [(1, 8), (28, 8), (29, 7), (64, 3), (85, 2), (86, 1), (1000, 1)],
)
def test_default_depth(num_requests, depth):
    assert tree_depth(num_requests, AdaptiveTreeConfig()) == depth


@pytest.mark.parametrize(
    "num_requests, width",
    # floor(64 / n) + 0 clipped to [1, 4]
    [(1, 4), (16, 4), (17, 3), (32, 2), (33, 1), (1000, 1)],
)
def test_default_width(num_requests, width):
    assert beam_width(num_requests, AdaptiveTreeConfig()) == width


def test_custom_config():
    config = AdaptiveTreeConfig(
        verify_tokens_per_step=100,
        draft_tokens_per_step=30,
        depth_offset=3,
        width_offset=2,
        min_depth=2,
        max_depth=6,
        max_width=5,
    )
    # depth: floor(100 / (n + 3)) - 1 -> n=7: 9 -> 6 (cap); n=17: 4; n=47: 1 -> 2 (floor)
    assert [tree_depth(n, config) for n in (7, 17, 47)] == [6, 4, 2]
    # width: floor(30 / n) + 2 -> n=10: 5; n=20: 3; n=40: 2
    assert [beam_width(n, config) for n in (10, 20, 40)] == [5, 3, 2]
    assert tree_shape(17, config) == (4, 3)
    narrow = AdaptiveTreeConfig(draft_tokens_per_step=30, width_offset=-3)
    assert beam_width(40, narrow) == 1  # floor(30 / 40) - 3 = -3 -> 1


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(verify_tokens_per_step=0), "verify_tokens_per_step"),
        (dict(draft_tokens_per_step=0), "draft_tokens_per_step"),
        (dict(depth_offset=-1), "depth_offset"),
        (dict(min_depth=0), "min_depth"),
        (dict(min_depth=5, max_depth=4), "min_depth <= max_depth"),
        (dict(max_width=0), "max_width"),
    ],
)
def test_config_rejects(fields, message):
    with pytest.raises(ValueError, match=message):
        AdaptiveTreeConfig(**fields)


@pytest.mark.parametrize("num_requests", [0, -1, 2.0])
def test_rejects_bad_num_requests(num_requests):
    with pytest.raises(ValueError, match="num_requests"):
        tree_depth(num_requests, AdaptiveTreeConfig())
    with pytest.raises(ValueError, match="num_requests"):
        beam_width(num_requests, AdaptiveTreeConfig())
