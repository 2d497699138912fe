"""Benchmark numbers of `trainer eval --data`: the answer a completion gives, maj@k, the 95% interval,
and the checks of `eval.sets`."""

import json
import math

import pytest
from rl_core.config import ConfigError
from trainer.cli import main
from trainer.evaluate.benchmark import final_answer, interval, majority_at_k
from trainer.settings import build_settings


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("so \\boxed{\\frac{1}{2}} or \\boxed{ 3 }", "3"),
        ("2+2 = 4\n#### 4.0 apples", "4"),
        ("I think 12, no, 1,300", "1300"),
        ("  Paris ", "Paris"),
    ],
)
def test_final_answer(text, answer):
    assert final_answer(text) == answer


def test_majority_at_k_votes_over_disjoint_runs():
    answers = ["5", "6", "6", "5", "7", "7", "5", "5"]
    correct = [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0]
    # k=4: run 1 (5,6,6,5) ties 2-2, the first seen (5) wins: right; run 2 (7,7,5,5) ties, 7 first: wrong -> 0.5
    assert majority_at_k(answers, correct, 4) == 0.5
    # k=8: 5 has 4 votes of 8 against 6 and 7 with 2 each: right
    assert majority_at_k(answers, correct, 8) == 1.0
    # k=1: each sample alone, the mean of correct
    assert majority_at_k(answers, correct, 1) == 0.5
    # k=3: runs (5,6,6) -> 6 wrong, (5,7,7) -> 7 wrong; the last two samples are no whole run -> 0
    assert majority_at_k(answers, correct, 3) == 0.0
    with pytest.raises(ValueError, match="1 <= k <= n"):
        majority_at_k(answers, correct, 9)


def test_interval_is_the_normal_one_over_prompts():
    got = interval([1.0, 0.0, 1.0, 1.0])
    # mean 0.75, sample std sqrt(0.25) = 0.5, half width 1.96 * 0.5 / 2 = 0.49
    assert got["mean"] == 0.75 and got["n"] == 4
    assert math.isclose(got["low"], 0.26) and got["high"] == 1.0  # 1.24 clipped to 1
    assert interval([0.5]) == {"mean": 0.5, "low": 0.5, "high": 0.5, "n": 1}


def test_eval_sets_are_checked_with_the_settings(tmp_path):
    rows = tmp_path / "b.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{a}+1=", "solution": str(a + 1)}) + "\n" for a in range(4)))
    settings = build_settings(algo="grpo", overrides=[f"eval.sets.bench.data={rows}", "eval.sets.bench.size=2"])
    assert settings.eval.sets == {"bench": {"data": str(rows), "size": 2}}
    with pytest.raises(ConfigError, match=r"eval.sets.bench: data path .*nope.jsonl' does not exist"):
        build_settings(algo="grpo", overrides=[f"eval.sets.bench.data={tmp_path / 'nope.jsonl'}"])
    with pytest.raises(ConfigError, match=r"bench.sise: not a key of an evaluation set"):
        build_settings(algo="grpo", overrides=[f"eval.sets.bench.data={rows}", "eval.sets.bench.sise=2"])
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps({"prompt": f"{a}"}) + "\n" for a in range(3)))
    with pytest.raises(ConfigError, match=r"eval.sets.x: the rows of .* carry no reference answer"):
        build_settings(algo="grpo", overrides=[f"eval.sets.x.data={bare}"])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--data", "b.jsonl"], "trainer eval --data needs either --run DIR or --model DIR"),
        (["--data", "b.jsonl", "--run", "r", "--model", "m"], "trainer eval --data needs either --run DIR or --model DIR"),
        (["--data", "b.jsonl", "--model", "m", "--k", "4", "--samples", "2"], "--k = 4 and --samples = 2: need 1 <= k <= samples"),
        (["--reward", "boxed"], "trainer eval needs --run DIR (held-out split), or --data FILE with --run DIR or --model DIR"),
    ],
)
def test_eval_with_data_says_what_it_needs(capsys, argv, message):
    assert main(["eval", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trainer eval: error: ") and message in err
