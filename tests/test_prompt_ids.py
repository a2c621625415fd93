"""The plugin's check of a prompt's token ids (`plugin._check_prompt_ids`), on a stand-in for
SGLang's tokenizer manager: the end-to-end tests (tests/e2e/test_request_slo_http.py) send
JSON, whose ids are Python ints; `sglang.Engine` callers may pass numpy's or torch's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from sgl_adaspec.adapters.plugin import _check_prompt_ids

MANAGER = SimpleNamespace(model_config=SimpleNamespace(vocab_size=10))
REQUEST = SimpleNamespace(input_embeds=None, image_data=None, video_data=None, audio_data=None)


@pytest.mark.parametrize(
    "ids", [[0, 9], list(np.array([1, 2])), list(torch.tensor([3, 4])), None], ids=repr
)
def test_ids_in_the_vocabulary_pass(ids):
    _check_prompt_ids(None, MANAGER, REQUEST, ids)


@pytest.mark.parametrize(
    ("ids", "shown"),
    [
        ([1, 10], "10"), ([-1], "-1"), ([1.5], "1.5"), (["a"], "'a'"),
        (list(torch.tensor([1.0])), "tensor(1.)"),
    ],
)  # fmt: skip
def test_ids_outside_the_vocabulary_are_refused_by_value(ids, shown):
    vocabulary = "not a token id of the model's vocabulary \\[0, 10\\)"
    with pytest.raises(ValueError, match=vocabulary) as err:
        _check_prompt_ids(None, MANAGER, REQUEST, ids)
    assert f"input_ids contains {shown}," in str(err.value)


def test_a_prompt_of_no_tokens_is_refused():
    with pytest.raises(ValueError, match="the prompt is empty"):
        _check_prompt_ids(None, MANAGER, REQUEST, [])


@pytest.mark.parametrize("field", ["input_embeds", "image_data", "video_data", "audio_data"])
def test_requests_with_embeddings_or_media_are_left_to_sglang(field):
    """A multimodal processor's ids may hold placeholders outside the text vocabulary."""
    request = SimpleNamespace(**{**vars(REQUEST), field: ["x"]})
    _check_prompt_ids(None, MANAGER, request, [])
    _check_prompt_ids(None, MANAGER, request, [1, 10**6])
