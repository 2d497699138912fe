"""The bring-your-own-task example from a clean copy (e2e): `trainer train` on its verl-schema Parquet
file and on its TRL conversational file scored by `my_rewards.py:function`s, `trainer eval` of the run,
and `trainer compare` (two variants, two seeds, two steps) on the same data."""

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
from trainer.cli import main

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bring-your-own-task"
SHORT = ["--no-progress", "warm_start.steps=2", "training.num_steps=2", "training.prompts_per_step=4",
         "algorithm.group_size=4", "eval.every_steps=0", "eval.heldout_size=8", "eval.samples_per_prompt=2",
         "eval.pass_k=1"]


@pytest.fixture
def clean_copy(tmp_path, monkeypatch):
    """The example's files alone, in a fresh folder, where the commands run (as in the guide)."""
    shutil.copytree(EXAMPLE, tmp_path / "examples" / "bring-your-own-task",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def steps(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"rewards/total/mean"' in line]


def test_verl_parquet_trains_with_the_reward_chosen_from_its_ground_truth(clean_copy):
    run = clean_copy / "runs" / "verl"
    assert main(["train", "--algo", "grpo", "--data", "examples/bring-your-own-task/sums.parquet",
                 "--output", str(run), *SHORT]) == 0
    rows = steps(run)
    assert len(rows) == 2 and all("rewards/numeric_answer/mean" in row for row in rows)  # numbers: numeric_answer
    assert json.loads((run / "summary.json").read_text())["steps"] == 2


def test_trl_conversational_file_with_rewards_from_a_python_file_then_eval(clean_copy, capsys):
    run = clean_copy / "runs" / "trl"
    assert main(["train", "--algo", "grpo", "--data", "examples/bring-your-own-task/sums.jsonl",
                 "--config", "examples/bring-your-own-task/config.yaml", "--output", str(run), *SHORT]) == 0
    for row in steps(run):
        assert {"rewards/exact/mean", "rewards/brevity/mean", "rewards/carries/mean"} <= set(row)
        # carries is routed to data_source "carry": the group of each other prompt (4 completions) is unscored
        assert row.get("rewards/carries/unscored", 0.0) % 4 == 0
        assert row["rewards/failed"] == 0.0
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--k", "1", "--samples", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 2 and result["heldout_size"] == 8 and 0.0 <= result["eval/accuracy"] <= 1.0


def test_compare_two_variants_two_seeds_on_the_users_data(clean_copy):
    out = clean_copy / "cmp"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(["compare", "grpo", "dr_grpo", "--seeds", "2", "--data", "examples/bring-your-own-task/sums.jsonl",
                     "--config", "examples/bring-your-own-task/config.yaml", "--output", str(out), *SHORT])
    assert code == 0
    assert (out / "results.json").is_file() and "dr_grpo" in printed.getvalue()
    for algo in ("grpo", "dr_grpo"):
        runs = sorted((out / algo).glob("seed-*"))
        assert len(runs) == 2 and all(len(steps(r)) == 2 for r in runs)
        assert all("rewards/carries/mean" in steps(r)[0] for r in runs)  # the user's rewards in every run
