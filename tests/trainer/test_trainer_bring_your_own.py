"""The bring-your-own-task example from a clean copy (e2e): `trainer train` on its verl-schema Parquet
file and on its TRL conversational file scored by `my_rewards.py:function`s (with an evaluation set),
`trainer eval` of the run on its held-out split and on a benchmark file, `trainer eval --model` of a
model folder, and `trainer compare` (two variants, two seeds, two steps) on the same data."""

import contextlib
import io
import json
import shutil
from pathlib import Path

import pytest
from trainer.cli import main

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "bring-your-own-task"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
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


def conversations(path: Path) -> Path:
    """A benchmark in the conversation shape: 12 sums, the reference as the final assistant turn."""
    path.write_text("".join(json.dumps({
        "messages": [{"role": "user", "content": f"{a}+{a}="}, {"role": "assistant", "content": str(2 * a)}],
        "data_source": "even" if a % 2 == 0 else "odd"}) + "\n" for a in range(12)))
    return path


def test_trl_conversational_file_with_rewards_from_a_python_file_then_eval(clean_copy, capsys):
    run = clean_copy / "runs" / "trl"
    assert main(["train", "--algo", "grpo", "--data", "examples/bring-your-own-task/sums.jsonl",
                 "--config", "examples/bring-your-own-task/config.yaml", "--output", str(run), *SHORT,
                 "eval.every_steps=1", "eval.sets.verl.data=examples/bring-your-own-task/sums.parquet",
                 "eval.sets.verl.size=4"]) == 0
    for row in steps(run):
        assert {"rewards/exact/mean", "rewards/brevity/mean", "rewards/carries/mean"} <= set(row)
        # carries is routed to data_source "carry": the group of each other prompt (4 completions) is unscored
        assert row.get("rewards/carries/unscored", 0.0) % 4 == 0
        assert row["rewards/failed"] == 0.0
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if "eval/verl/accuracy" in line]
    assert len(evals) == 2 and all(0.0 <= e["eval/verl/accuracy"] <= 1.0 and "eval/accuracy" in e for e in evals)
    capsys.readouterr()
    assert main(["eval", "--run", str(run), "--k", "1", "--samples", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["step"] == 2 and result["heldout_size"] == 8 and 0.0 <= result["eval/accuracy"] <= 1.0
    bench = conversations(clean_copy / "bench.jsonl")
    assert main(["eval", "--run", str(run), "--data", str(bench), "--k", "2", "--samples", "4"]) == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads((run / "eval" / "bench.json").read_text())  # beside the run
    assert printed == saved and saved["rows"] == 12 and saved["reward"] == "exact"  # the run's reward
    assert {name: part["rows"] for name, part in saved["per_data_source"].items()} == {"even": 6, "odd": 6}
    for part in (saved, *saved["per_data_source"].values()):
        for metric in ("accuracy", "pass@2", "maj@2"):
            low, mean, high = part[metric]["low"], part[metric]["mean"], part[metric]["high"]
            assert 0.0 <= low <= mean <= high <= 1.0


def test_eval_of_a_model_folder_on_a_benchmark_file(clean_copy, capsys):
    bench = conversations(clean_copy / "bench.jsonl")
    assert main(["eval", "--model", str(FIXTURES / "qwen2"), "--data", str(bench), "--k", "1", "--samples", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    # the references are numbers: numeric_answer says what is correct; a random tiny model answers nothing right
    assert result["reward"] == "numeric_answer" and result["rows"] == 12 and result["step"] == 0
    assert result["accuracy"]["n"] == 12 and result["per_data_source"]["odd"]["rows"] == 6


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
