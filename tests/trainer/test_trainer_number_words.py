"""The number_words task's spelled numbers and its exact checker, by hand."""

import numpy as np
import pytest

from trainer.tasks.number_words import number_word, number_words, spelled_answer_reward


@pytest.mark.parametrize(("n", "word"), [(0, "zero"), (7, "seven"), (12, "twelve"), (19, "nineteen"),
                                         (20, "twenty"), (42, "forty-two"), (99, "ninety-nine")])
def test_number_word(n, word):
    assert number_word(n) == word


def test_number_word_refuses_what_it_cannot_spell():
    with pytest.raises(ValueError, match="only 0..99"):
        number_word(100)


def test_spelled_answer_reads_words_not_digits():
    # "twelve" for 12 is right, any case and spacing; "12" (digits) and "eleven" are not
    got = spelled_answer_reward(["p"] * 4, ["twelve", " Twelve\n", "12", "eleven"], answer=["12", "12", "12", "12"])
    assert got == [1.0, 1.0, 0.0, 0.0]


def test_judge_examples_are_half_right_and_labelled_truly():
    task = number_words(max_number=9)
    examples = task.judge_examples(np.random.default_rng(0), 400)
    words = {number_word(n): n for n in range(19)}
    for prompt, completion, reference, correct in examples:
        a, b = map(int, prompt.split(" ")[0].split("+"))
        assert reference == str(a + b) and correct == (words[completion] == a + b)
    assert 0.4 < np.mean([e[3] for e in examples]) < 0.6


def test_the_task_brings_its_judge():
    task = number_words()
    assert task.judge["train_steps"] > 0 and task.judge["verdict"] == "yes_probability"
    assert task.correct == "spelled_answer" and task.rewards[0].weight == 0.0
