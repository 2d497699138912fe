"""On-policy distillation in the trainer: `algorithm.teacher` (a run folder or a Hugging Face folder)
checked before any model loads, the teacher's tokenizer checked against the student's, `trainer plan`
counting the teacher's bytes, and distilling runs end to end (opd alone, GRPO + distill_coef)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from rl_core.config import ConfigError
from rl_models import CharTokenizer
from rl_models.hf import load_hf_tokenizer
from trainer import build
from trainer.compare.sweep import default_algos
from plan_bytes import planned_parts
from rl_core.rollout import argument_bytes
from host import backend as jax_backend
from trainer.run.teacher import check_same_tokenizer, load_teacher
from trainer.settings import build_settings

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf"
TINY = ["training.prompts_per_step=2", "algorithm.group_size=2", "eval.heldout_size=8", "eval.samples_per_prompt=2",
        "eval.pass_k=1", "eval.every_steps=0", "training.checkpoint_every_steps=1"]


def test_a_distilling_run_needs_an_existing_teacher(tmp_path):
    with pytest.raises(ConfigError, match=r"OPDConfig.distill_coef = 1.0: distillation needs algorithm.teacher"):
        build_settings(algo="opd")
    with pytest.raises(ConfigError, match=r"OPDConfig.teacher = '.*nowhere': must be an existing folder"):
        build_settings(algo="opd", overrides=[f"algorithm.teacher={tmp_path / 'nowhere'}"])
    with pytest.raises(ConfigError, match="a teacher is only read with distill_coef > 0"):
        build_settings(algo="grpo", overrides=[f"algorithm.teacher={tmp_path}"])
    grpo = build_settings(algo="grpo", overrides=["algorithm.distill_coef=0.5", f"algorithm.teacher={tmp_path}"])
    assert grpo.algorithm_config().distill_coef == 0.5


def test_a_per_sequence_policy_loss_with_per_token_advantages_is_refused_before_anything_loads(tmp_path, capsys):
    """GSPO's loss takes one advantage per completion: distillation's per-token term (or a critic's
    per-token advantages) is refused with the settings, not by a shape error in the first update."""
    from trainer.cli import main

    argv = ["train", "--algo", "gspo", "algorithm.distill_coef=0.5", f"algorithm.teacher={tmp_path}",
            "--output", str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("trainer train: error: GSPOConfig.policy_loss = 'gspo': takes one advantage per completion, but "
                   "distill_coef > 0 gives each token an advantage of its own; use a per-token policy loss "
                   "(GSPO's per-token form: algorithm.policy_loss=gspo_token)")
    assert not (tmp_path / "run").exists()
    token = build_settings(algo="gspo", overrides=["algorithm.distill_coef=0.5", f"algorithm.teacher={tmp_path}",
                                                   "algorithm.policy_loss=gspo_token"])
    assert token.algorithm_config().policy_loss == "gspo_token"
    with pytest.raises(ConfigError, match=r"PPOConfig.policy_loss = 'gspo': .* gae gives per-token advantages"):
        build_settings(algo="ppo", overrides=["algorithm.policy_loss=gspo"])


def test_the_teacher_must_share_the_students_tokenizer():
    qwen = load_hf_tokenizer(HF / "qwen2")
    check_same_tokenizer(load_hf_tokenizer(HF / "qwen2"), qwen, "same")  # the same tokenizer passes
    with pytest.raises(ConfigError, match=r"algorithm.teacher = 'q': its tokenizer \(HFTokenizer\) is not the "
                                          r"student's \(CharTokenizer\): vocabulary size.* differ"):
        check_same_tokenizer(qwen, CharTokenizer(), "q")


def test_a_run_folder_teacher_with_another_tokenizer_is_refused(tmp_path):
    # a run folder of a Qwen2 policy (config.yaml is what marks a run folder) for a char-tokenizer student
    from trainer.run import folder as run_folder

    run_folder.write_config(tmp_path, build_settings(overrides=[f"model.path={HF / 'qwen2'}"]))
    for teacher in (tmp_path, HF / "qwen2"):  # the run folder (before any checkpoint is read), the model folder
        student = build_settings(algo="opd", overrides=[f"algorithm.teacher={teacher}"])
        refused = f"algorithm.teacher = '{teacher}': its tokenizer .* is not the student's"
        with pytest.raises(ConfigError, match=refused):
            load_teacher(student, CharTokenizer())


def test_compare_leaves_out_algorithms_that_need_a_teacher():
    names = default_algos()
    assert "opd" not in names and {"grpo", "dapo", "ppo"} <= set(names)


def test_a_checkpoint_is_read_without_its_teacher(tmp_path):
    opd = build_settings(algo="opd", overrides=[f"algorithm.teacher={tmp_path}"])
    shapes = build.without_distillation(opd)
    assert shapes.algorithm_config().distill_coef == 0.0 and shapes.algorithm_config().teacher is None
    grpo = build_settings(algo="grpo")
    assert build.without_distillation(grpo) is grpo


@pytest.mark.e2e  # compiles the run's programs on abstract arrays
def test_plan_counts_the_teachers_bytes(tmp_path):
    from trainer.plan import memory_budget, plan
    from trainer.run import folder as run_folder

    # a run folder teacher (its settings name the model: the tiny preset, float32) beside a tiny student
    run_folder.write_config(tmp_path, build_settings(overrides=["model.preset=tiny"]))
    common = ["model.preset=tiny", "training.prompts_per_step=2", "algorithm.group_size=2", "rollout.engine=paged"]
    opd = plan(build_settings(algo="opd", overrides=[*common, f"algorithm.teacher={tmp_path}"]), memory_budget("cpu"))
    alone = plan(build_settings(algo="dapo", overrides=common), memory_budget("cpu"))  # beta = 0, no teacher
    assert opd.teacher_parameters == opd.parameters  # the teacher is the student's size here
    assert opd.analytic["teacher"] == 4 * opd.parameters  # float32, one device; compiled: as laid out
    assert opd.compiled["teacher"] == argument_bytes(planned_parts(build_settings(overrides=["model.preset=tiny"]))[0])
    assert jax_backend() != "cpu" or opd.compiled["teacher"] == 4 * opd.parameters  # dense there: the hand count
    assert opd.resident_bytes == alone.resident_bytes + opd.compiled["teacher"]
    assert opd.program_bytes["teacher"] == opd.compiled["teacher_temporaries"] > 0
    assert "distillation teacher" in opd.table() and "teacher" not in alone.program_bytes


def train(tmp_path: Path, name: str, *overrides: str) -> dict:
    from trainer.run import train_run

    settings = build_settings(overrides=[*TINY, *overrides])
    train_run(settings, tmp_path / name, progress=False, log=lambda _: None, teacher=load_teacher)
    return [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.e2e
def test_distilling_runs_end_to_end(tmp_path):
    """A teacher run (a longer warm start than the student's, so the two differ), then the student
    distilled from it alone (opd) and beside GRPO's reward (distill_coef), each one update."""
    train(tmp_path, "teacher", "algo=grpo", "warm_start.steps=40", "training.num_steps=1")
    teacher = f"algorithm.teacher={tmp_path / 'teacher'}"
    for name, algo in (("opd", ["algo=opd"]), ("grpo", ["algo=grpo", "algorithm.distill_coef=0.5"])):
        metrics = train(tmp_path, name, *algo, teacher, "warm_start.steps=20", "training.num_steps=1")[-1]
        # the student's own tokens are likelier under itself than under a teacher that differs
        assert metrics["train/distill_reverse_kl"] > 0.01, name
        assert math.isfinite(metrics["train/loss"]) and metrics["train/skipped_updates"] == 0, name
    # the student's checkpoint reads back without its teacher (trainer eval, trainer export)
    from trainer.run import load_run_policy

    assert load_run_policy(tmp_path / "opd").step == 1
