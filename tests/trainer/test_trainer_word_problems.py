"""The easy GSM8K-format word problem generator: seeded, distinct rows whose '#### N' is the right answer."""

import json
import re

import pytest
from trainer.tasks import gsm8k
from trainer.tasks.word_problems import easy_word_problems, main


def test_seeded_distinct_and_answers_right():
    rows = easy_word_problems(300, seed=3)
    assert rows == easy_word_problems(300, seed=3)
    assert rows != easy_word_problems(300, seed=4)
    assert len({r["question"] for r in rows}) == 300
    for row in rows:
        *work, last = row["answer"].split("\n")
        final = int(re.fullmatch(r"#### (\d+)", last).group(1))
        # every worked line's arithmetic is right, and the last one gives the final number
        for line in work:
            lhs, rhs = re.search(r"([\d +*-]+) = (\d+)", line).groups()
            assert eval(lhs) == int(rhs)  # noqa: S307 - digits and + - * only
        assert int(re.search(r"= (\d+)", work[-1]).group(1)) == final >= 0
    assert {len(r["answer"].split("\n")) for r in rows} == {2, 3}  # one- and two-step problems
    assert {len(r["answer"].split("\n")) for r in easy_word_problems(50, steps=1)} == {2}


def test_bad_options():
    for bad in ({"steps": 3}, {"max_number": 2}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            easy_word_problems(10, **bad)
    with pytest.raises(ValueError, match="count"):
        easy_word_problems(0)


def test_written_file_loads_as_gsm8k_task(tmp_path, capsys):
    out = tmp_path / "easy.jsonl"
    assert main([str(out), "--count", "40", "--seed", "1"]) == 0
    assert "wrote 40 problems" in capsys.readouterr().out
    assert [json.loads(line) for line in out.read_text().splitlines()] == easy_word_problems(40, seed=1)
    task = gsm8k(data=str(out), heldout_size=8)  # every reference is scorable by the gsm8k reward
    assert (len(task.train), len(task.heldout)) == (32, 8)


def test_the_file_goes_into_a_folder_not_made_yet(tmp_path):
    """`data/easy.jsonl` in a fresh clone, as docs/models-and-data.md writes it."""
    out = tmp_path / "data" / "easy.jsonl"
    assert main([str(out), "--count", "3"]) == 0
    assert len(out.read_text().splitlines()) == 3


def test_a_reference_longer_than_the_completion_budget_stops_the_warm_start_in_one_line(tmp_path):
    """A warm start on rows whose reference solution does not fit task.options.max_new_tokens names
    the setting and the way out (it was a ValueError traceback)."""
    import numpy as np

    from rl_core.config import ConfigError
    from rl_models.hf import load_hf_tokenizer
    from trainer.warmstart import sft_arrays

    out = tmp_path / "easy.jsonl"
    assert main([str(out), "--count", "4"]) == 0
    task = gsm8k(data=str(out), heldout_size=1, max_new_tokens=16)
    tokenizer = load_hf_tokenizer("tests/fixtures/hf/qwen2")
    with pytest.raises(ConfigError, match=r"warm start: the task's reference completion for '.*' has \d+ tokens, more "
                       r"than the 16 new tokens a completion may have \(task.options.max_new_tokens\); raise that, or "
                       r"skip the warm start with warm_start.steps=0"):
        sft_arrays(task, tokenizer, task.train, np.random.default_rng(0))
