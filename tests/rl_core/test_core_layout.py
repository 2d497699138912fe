"""rl_core.train.layout: which mini-batches carry each group's prompt once (`SharedPrompts`)."""

from __future__ import annotations

import numpy as np
import pytest

from rl_core.runtime import mesh as mesh_lib
from rl_core.config import TrainingConfig
from rl_core.train.layout import BatchLayout
from rl_core.types import TrainExample

G, PROMPTS, P, T = 2, 4, 3, 5


def grouped_example(prompt_tokens: np.ndarray) -> TrainExample:
    """PROMPTS prompts [PROMPTS, P] (left-padded by their zeros), each repeated for its G rows."""
    rows = np.repeat(prompt_tokens, G, axis=0)
    b = len(rows)
    return TrainExample(rows, (rows > 0).astype(np.float32), np.ones((b, T), np.int32),
                        np.ones((b, T), np.float32), np.zeros(b, np.float32))


PROMPT_TOKENS = np.array([[0, 5, 6], [7, 8, 9], [0, 0, 4], [3, 3, 3]], np.int32)


def layout(**training) -> BatchLayout:
    config = TrainingConfig(prompts_per_step=PROMPTS, **training)
    return BatchLayout(config, PROMPTS * G, mesh_lib.data_mesh(), group_size=G)


def test_mini_batches_carry_each_groups_prompt_once_split_like_their_rows():
    minis = layout(mini_batch_size=4, micro_batch_size=2).mini_batches(grouped_example(PROMPT_TOKENS))
    assert len(minis) == 2
    for i, mini in enumerate(minis):
        assert mini.prompt_tokens.shape == (2, 2, P)  # [micro-batches, rows, P]
        shared = mini.shared_prompts
        assert shared.tokens.shape == shared.mask.shape == (2, 1, P)  # one prompt per micro-batch of G rows
        np.testing.assert_array_equal(shared.tokens[:, 0], PROMPT_TOKENS[2 * i : 2 * i + 2])
        np.testing.assert_array_equal(shared.mask, (shared.tokens > 0).astype(np.float32))
        np.testing.assert_array_equal(mini.prompt_tokens[:, 0], shared.tokens[:, 0])


def test_a_group_with_two_prompts_is_not_shared():
    example = grouped_example(PROMPT_TOKENS)
    tokens = example.prompt_tokens.copy()
    tokens[5, 1] = 4  # row 5 (the second of group 2) differs in one token
    (mini,) = layout().mini_batches(example._replace(prompt_tokens=tokens))
    assert mini.shared_prompts is None
    mask = example.prompt_mask.copy()
    mask[1, 0] = 1.0  # the same tokens, a different mask
    (mini,) = layout().mini_batches(example._replace(prompt_mask=mask))
    assert mini.shared_prompts is None


@pytest.mark.parametrize("training", [
    {"share_prompts": False},
    {"packing": True},  # packed rows mix sequences of several groups
    {"micro_batch_size": 1},  # a micro-batch is not a whole group
], ids=["off", "packing", "split-groups"])
def test_prompts_are_not_shared_when(training):
    split = layout(**training)
    assert split.prompt_group == 1
    example = grouped_example(PROMPT_TOKENS)
    assert split.shared_prompts(example.prompt_tokens, example.prompt_mask) is None


def test_forward_passes_are_handed_each_micro_batchs_shared_prompts():
    """`micro_batched(shares=True)` (the log-prob passes) gives the program the micro-batches'
    prompts once per group as its last input; None where a group has two prompts."""
    split = layout(micro_batch_size=4)  # 2 micro-batches of 2 groups
    example = grouped_example(PROMPT_TOKENS)
    fields = (example.prompt_tokens, example.prompt_mask, example.completion_tokens)

    def inputs(*fields, shares):
        return split.micro_batched(lambda params, frozen, xs: xs, None, None, *fields, shares=shares)

    *rows, shared = inputs(*fields, shares=True)
    assert rows[0].shape == (2, 4, P)
    assert shared.tokens.shape == shared.mask.shape == (2, 2, P)
    np.testing.assert_array_equal(shared.tokens.reshape(-1, P), PROMPT_TOKENS)
    tokens = example.prompt_tokens.copy()
    tokens[5, 1] = 4
    assert inputs(tokens, *fields[1:], shares=True)[-1] is None
    assert len(inputs(*fields, shares=False)) == 3  # a pass that does not share gets no such input
