"""format_reward: strict and lenient templates, custom tags, and tag extraction."""

import pytest

from rewards import format_reward
from rewards.formatting import tag_content

GOOD = "<think>Add them: 2 + 2.</think><answer>4</answer>"


@pytest.mark.parametrize(
    ("completion", "strict", "lenient"),
    [
        (GOOD, 1.0, 1.0),
        ("\n  " + GOOD + "\n\n", 1.0, 1.0),  # surrounding whitespace is fine
        ("<think>a</think>\n\n<answer>4</answer>", 1.0, 1.0),  # whitespace between the blocks
        ("<think></think><answer>4</answer>", 1.0, 1.0),  # empty reasoning is allowed
        ("<think>a</think><answer> </answer>", 0.0, 1.0),  # blank answer: strict only
        ("<answer>4</answer><think>a</think>", 0.0, 0.0),  # wrong tag order
        ("<think>a<answer>4</answer></think>", 0.0, 0.0),  # answer inside think
        (GOOD + " 5", 0.0, 1.0),  # answer text after the closing tag
        (GOOD + "<answer>5</answer>", 0.0, 0.0),  # a second answer
        ("Sure! " + GOOD, 0.0, 1.0),  # text before <think>
        ("<think>a</think> so <answer>4</answer>", 0.0, 1.0),  # text between the blocks
        ("<think>a</think><think>b</think><answer>4</answer>", 0.0, 0.0),  # think twice
        ("<think>a</think><answer>4", 0.0, 0.0),  # unclosed answer
        ("<think>a<answer>4</answer>", 0.0, 0.0),  # unclosed think
        ("<think>a</think>", 0.0, 0.0),
        ("4", 0.0, 0.0),
        ("", 0.0, 0.0),
        ("<THINK>a</THINK><ANSWER>4</ANSWER>", 0.0, 0.0),  # tags are case-sensitive
    ],
)
def test_format_reward(completion, strict, lenient):
    assert format_reward(strict=True)(["p"], [completion]) == [strict]
    assert format_reward(strict=False)(["p"], [completion]) == [lenient]


def test_format_reward_names_and_custom_tags():
    strict, lenient = format_reward(), format_reward(strict=False)
    assert (strict.__name__, lenient.__name__) == ("format_strict", "format_lenient")
    custom = format_reward(think_tag="reasoning", answer_tag="final")
    assert custom(["p", "p"], ["<reasoning>r</reasoning><final>1</final>", GOOD]) == [1.0, 0.0]


@pytest.mark.parametrize(
    "kwargs",
    [{"think_tag": ""}, {"answer_tag": "<answer>"}, {"think_tag": "a b"}, {"think_tag": "x", "answer_tag": "x"}],
)
def test_format_reward_rejects_bad_tag_names(kwargs):
    with pytest.raises(ValueError, match="tag"):
        format_reward(**kwargs)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>4</answer>", "4"),
        ("<answer>1</answer> <answer>2</answer>", "2"),
        ("<answer>4", None),
        ("4</answer>", None),
        ("</answer><answer>", None),
        ("<answer></answer>", ""),
    ],
)
def test_tag_content(text, expected):
    assert tag_content(text, "answer") == expected
