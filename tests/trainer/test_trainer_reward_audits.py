"""Reward audits end to end (#47): a reward that pays cut-off completions trips them (a warning
line with the numbers, reward_audit/* metrics, the start-of-run probe, summary.json), and the
built-in arithmetic task with its own reward leaves them quiet."""

import dataclasses
import json
import re

import pytest
from rewards import RewardSpec

from trainer.run import train_run
from trainer.settings import build_settings
from trainer.tasks import arithmetic

pytestmark = pytest.mark.e2e

SHORT = [
    "training.num_steps=3", "training.prompts_per_step=4", "algorithm.group_size=4",
    "training.checkpoint_every_steps=0", "eval.heldout_size=8", "eval.samples_per_prompt=1", "eval.pass_k=1",
    "eval.every_steps=0",
]  # fmt: skip


def paid_cut_off(**options):
    """Arithmetic plus the hack: a reward of 1 for every completion that reaches max_new_tokens."""
    task = arithmetic(**options)

    def pays_cut_off(prompts, completions, *, completion_lengths, **_):
        return [float(n >= task.max_new_tokens) for n in completion_lengths]

    return dataclasses.replace(task, rewards=(*task.rewards, RewardSpec(pays_cut_off)))


def run(tmp_path, overrides):
    lines = []
    settings = build_settings(algo="grpo", overrides=[*SHORT, *overrides])
    summary = train_run(settings, tmp_path / "run", progress=False, log=lines.append)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    return lines, records, summary


def test_a_reward_that_pays_cut_off_completions_trips_the_audits(tmp_path):
    # random weights (no warm start) rarely end with EOS: nearly every completion is cut off, and paid
    lines, records, summary = run(tmp_path, [f"task.name={__file__}:paid_cut_off", "warm_start.steps=0",
                                             "reward_audit.constant_steps=2"])
    probe = [line for line in lines if line.startswith("reward audit probe:")]
    # the repetition stands at the length limit on all 8 probe prompts (an echoed "a+b=" does when it is
    # as long as max_new_tokens = 5); the task's own reward pays nothing
    assert len(probe) == 1 and probe[0].startswith(
        "reward audit probe: 'pays_cut_off' pays adversarial completions (mean score, prompts paid): ")
    assert probe[0].endswith("repeat 1.00 (8/8 prompts)")
    warned = [line for line in lines if line.startswith("reward audit, step")]
    unfinished = [line for line in warned if "rewarded completions did not finish" in line]
    assert len(unfinished) == 1 and unfinished[0].startswith("reward audit, step 1: ")  # once, not every step
    assert int(re.search(r"(\d+)% of the rewarded", unfinished[0]).group(1)) > 25
    assert any("reward 'pays_cut_off' makes" in line for line in warned)
    # numeric_answer pays no random completion: constant in every group on steps 1 and 2, warned at step 2
    assert any(line.startswith("reward audit, step 2: reward 'numeric_answer' has been the same") for line in warned)
    for record in records:
        assert record["reward_audit/unfinished_rewarded"] > 0.25
        assert record["reward_audit/share/pays_cut_off"] > 0.5
        assert record["reward_audit/tripped"] >= 2
    assert [r["reward_audit/constant_groups_steps/numeric_answer"] for r in records] == [1.0, 2.0, 3.0]
    report = summary["reward_audit"]
    assert list(report["probe"]["flagged"]) == ["pays_cut_off"]
    assert "repeat" in report["probe"]["flagged"]["pays_cut_off"]
    assert report["probe"]["paid"]["numeric_answer"] == {"empty": 0, "echo": 0, "repeat": 0}
    assert report["tripped"]["unfinished_rewarded"]["steps"] == 3
    assert report["tripped"]["constant_groups/numeric_answer"] == {"steps": 2, "first_step": 2, "worst": 3.0}
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["reward_audit"] == report


def test_the_builtin_arithmetic_task_leaves_the_audits_quiet(tmp_path):
    # a short warm start: the policy ends its answers with EOS and gets some of 3 x 64 right
    lines, records, summary = run(tmp_path, ["warm_start.steps=300", "training.prompts_per_step=8",
                                             "algorithm.group_size=8"])
    assert "reward audit probe: no reward pays an empty, echoed or cut-off completion (8 prompts)" in lines
    assert not [line for line in lines if line.startswith("reward audit")
                and not line.startswith("reward audit probe:")]
    for record in records:
        assert record["completions/truncated_frac"] < 0.25  # the audit had finished completions to look at
        assert record["reward_audit/tripped"] == 0.0
        assert record["reward_audit/unfinished_rewarded"] <= 0.25
        assert record["reward_audit/length_corr"] <= 0.5
        assert record["reward_audit/share/numeric_answer"] in (0.0, 1.0)  # the only reward: all of it, or none paid
        assert 0.0 <= record["reward_audit/constant_groups_steps/numeric_answer"] <= 3.0
    assert sum(r["rewards/total/mean"] for r in records) > 0  # something was rewarded, so something was audited
    assert summary["reward_audit"]["tripped"] == {}
    assert summary["reward_audit"]["probe"]["flagged"] == {}
