"""rl_core.data and rl_core.policy.tokens: the resumable prompt order, left padding, buckets, decoding."""

import numpy as np
import pytest

from rl_core.data import Prompt, PromptStream
from rl_core.policy.tokens import bucket, decode_completions, left_pad
from rl_models import CharTokenizer

DATASET = [Prompt(f"p{i}", {"answer": str(i)}) for i in range(10)]


def texts(prompts):
    return [p.text for p in prompts]


def test_same_seed_same_order_other_seed_other_order():
    a = texts(PromptStream(DATASET, seed=7).next(25))
    assert a == texts(PromptStream(DATASET, seed=7).next(25))
    assert a != texts(PromptStream(DATASET, seed=8).next(25))


def test_each_epoch_is_a_permutation_and_epochs_reshuffle():
    stream = PromptStream(DATASET, seed=0)
    epochs = [texts(stream.next(len(DATASET))) for _ in range(3)]
    for epoch in epochs:
        assert sorted(epoch) == sorted(texts(DATASET))  # every prompt exactly once per epoch
    assert epochs[0] != epochs[1] and epochs[1] != epochs[2]
    assert stream.position == 30


def test_batches_span_epoch_boundaries_without_gaps():
    whole = texts(PromptStream(DATASET, seed=3).next(23))
    stream = PromptStream(DATASET, seed=3)
    pieces = [texts(stream.next(n)) for n in (4, 4, 4, 4, 4, 3)]
    assert sum(pieces, []) == whole


@pytest.mark.parametrize("position", [0, 3, 10, 17])
def test_restoring_the_position_continues_identically(position):
    original = PromptStream(DATASET, seed=5)
    original.next(position)
    continued = texts(original.next(15))
    restored = PromptStream(DATASET, seed=5, position=position)
    assert texts(restored.next(15)) == continued
    # also after the stream object already drew from another epoch (cached order is refreshed)
    moved = PromptStream(DATASET, seed=5)
    moved.next(27)
    moved.position = position
    assert texts(moved.next(15)) == continued


def test_prompt_fields_travel_with_the_prompt():
    for prompt in PromptStream(DATASET, seed=1).next(10):
        assert prompt.fields["answer"] == prompt.text[1:]


def test_empty_dataset_is_an_error():
    with pytest.raises(ValueError, match="empty"):
        PromptStream([], seed=0)


def test_bucket_is_the_next_power_of_two_capped_at_the_limit():
    assert [bucket(n, 64) for n in (1, 8, 9, 16, 17, 33, 64)] == [8, 8, 16, 16, 32, 64, 64]
    assert bucket(20, 24) == 24  # capped
    assert bucket(3, 64, smallest=4) == 4
    with pytest.raises(ValueError, match="length 65 exceeds the limit 64"):
        bucket(65, 64)


def test_left_pad_shapes_values_and_mask():
    tokens, mask = left_pad([[5, 6, 7], [9], [1, 2, 3, 4, 5]], pad_id=0, max_tokens=64)
    assert tokens.shape == mask.shape == (3, 8)  # longest is 5 -> bucket 8
    assert tokens.dtype == np.int32 and mask.dtype == np.float32
    np.testing.assert_array_equal(tokens[0], [0, 0, 0, 0, 0, 5, 6, 7])
    np.testing.assert_array_equal(tokens[1], [0, 0, 0, 0, 0, 0, 0, 9])
    np.testing.assert_array_equal(mask.sum(1), [3, 1, 5])
    np.testing.assert_array_equal(mask[2], [0, 0, 0, 1, 1, 1, 1, 1])


def test_left_pad_buckets_lengths_and_caps_at_max_tokens():
    assert left_pad([[1] * 9], pad_id=0, max_tokens=64)[0].shape == (1, 16)
    assert left_pad([[1] * 9, [2] * 3], pad_id=0, max_tokens=12)[0].shape == (2, 12)
    assert left_pad([[1] * 12], pad_id=0, max_tokens=12)[0].shape == (1, 12)


def test_left_pad_rejects_too_long_and_empty_prompts():
    with pytest.raises(ValueError, match="prompt 1 has 13 tokens, more than max_prompt_tokens=12"):
        left_pad([[1, 2], [3] * 13], pad_id=0, max_tokens=12)
    with pytest.raises(ValueError, match="prompt 0 is empty"):
        left_pad([[]], pad_id=0, max_tokens=12)


def test_decode_completions_keeps_masked_tokens_and_drops_eos():
    tok = CharTokenizer()
    (eos,) = tok.eos_ids
    ids = tok.encode("42") + [eos]
    tokens = np.array([ids + [tok.pad_id], tok.encode("7") + [eos, tok.pad_id, tok.pad_id]])
    mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
    assert decode_completions(tok, tokens, mask) == ["42", "7"]
    # tokens outside the mask never reach the text, whatever they are
    assert decode_completions(tok, tokens, np.array([[1, 0, 0, 0], [0, 0, 0, 0]])) == ["4", ""]
