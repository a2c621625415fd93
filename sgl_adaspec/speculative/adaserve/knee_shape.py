"""The knee rule's tree shape (AdaServe eq. 8-9): depth and beam width from the batch size n.

    d = clip(floor(B1 / (n + c1)) - 1, D_min, D_max)    w = clip(floor(B2 / n) + c2, 1, W_max)

B1 / B2: tokens per step the verifier / the draft may process for the batch. The paper gives
no values (grid search); the defaults suit small batches (depth 8 up to n = 28, width 4 up to
n = 16).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdaptiveTreeConfig:
    verify_tokens_per_step: int = 256  # B1
    draft_tokens_per_step: int = 64  # B2
    depth_offset: int = 0  # c1
    width_offset: int = 0  # c2
    min_depth: int = 1  # D_min
    max_depth: int = 8  # D_max
    max_width: int = 4  # W_max

    def __post_init__(self) -> None:
        if self.verify_tokens_per_step < 1 or self.draft_tokens_per_step < 1:
            raise ValueError(
                f"verify_tokens_per_step and draft_tokens_per_step must be >= 1, got "
                f"{self.verify_tokens_per_step} and {self.draft_tokens_per_step}"
            )
        if self.depth_offset < 0:
            raise ValueError(f"depth_offset (c1) must be >= 0, got {self.depth_offset}")
        if not 1 <= self.min_depth <= self.max_depth:
            raise ValueError(
                f"need 1 <= min_depth <= max_depth, got {self.min_depth} and {self.max_depth}"
            )
        if self.max_width < 1:
            raise ValueError(f"max_width must be >= 1, got {self.max_width}")


def _clip(value: int, low: int, high: int) -> int:
    return max(low, min(value, high))


def _check_num_requests(num_requests: int) -> None:
    if not isinstance(num_requests, int) or num_requests < 1:
        raise ValueError(f"num_requests must be an int >= 1, got {num_requests!r}")


def tree_depth(num_requests: int, config: AdaptiveTreeConfig) -> int:
    """Eq. 8."""
    _check_num_requests(num_requests)
    share = config.verify_tokens_per_step // (num_requests + config.depth_offset)
    return _clip(share - 1, config.min_depth, config.max_depth)


def beam_width(num_requests: int, config: AdaptiveTreeConfig) -> int:
    """Eq. 9."""
    _check_num_requests(num_requests)
    share = config.draft_tokens_per_step // num_requests
    return _clip(share + config.width_offset, 1, config.max_width)


def tree_shape(num_requests: int, config: AdaptiveTreeConfig) -> tuple[int, int]:
    return tree_depth(num_requests, config), beam_width(num_requests, config)
