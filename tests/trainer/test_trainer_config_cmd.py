"""`trainer config`, `--version` and `--help`: settings a user can discover, one name per concept."""

import dataclasses
import re
from importlib.metadata import version

import pytest

from rl_core.config import MeshConfig, RolloutConfig, TrainingConfig
from trainer.cli import main
from trainer.compare import DEFAULT_SEEDS
from trainer.settings import describe


def listing(algo: str) -> dict[str, list[str]]:
    """key -> [type, default, description] of `trainer config --algo ALGO` (columns are 2+ spaces apart)."""
    rows = [re.split(r"\s{2,}", line, maxsplit=3) for line in describe(algo).splitlines()[4:]]
    return {key: rest for key, *rest in rows}


def test_every_setting_is_listed_with_type_default_and_description():
    rows = listing("dapo")
    sections = [(TrainingConfig, "training"), (RolloutConfig, "rollout"), (MeshConfig, "training.mesh")]
    for cls, section in sections:
        for field in dataclasses.fields(cls):
            key = f"{section}.{field.name}"
            if key == "training.mesh":  # a nested section: listed field by field (checked as its own section)
                continue
            assert key in rows, key
            assert rows[key][2], f"{key} has no description"
    assert rows["training.mesh.fsdp"][:2] == ["int", "-1"]
    # the trainer's defaults, not the bare dataclass's (TrainingConfig's own learning_rate is 1e-5)
    assert rows["training.learning_rate"][:2] == ["float", "0.001"]
    assert rows["training.num_steps"][:2] == ["int", "300"]
    # the algorithm's own fields, nested sections flattened
    assert rows["algorithm.max_gen_batches"] == ["int", "4", "Cap on generation rounds per step (each round samples B prompts)."]
    assert rows["algorithm.epsilon_high"][:2] == ["float", "0.28"]
    assert rows["algorithm.overlong.penalty_factor"][:2] == ["float", "1.0"]
    assert rows["training.max_grad_norm"][0] == "float | None"
    assert rows["training.loggers"][:2] == ["list[str]", "[tensorboard]"]
    # the trainer drops long prompts by default: the text does not say they are an error
    assert "drops longer prompts when the task is loaded, or stops, per task.long_prompts (default drop)" in (
        rows["rollout.max_prompt_tokens"][2]
    )
    assert rows["task.long_prompts"][1] == "drop"
    # the run stops after this many skipped updates in a row (a NaN weight, broken data)
    assert rows["training.max_skipped_in_a_row"][:2] == ["int", "10"]


def test_another_algorithm_lists_its_own_fields(capsys):
    assert main(["config", "--algo", "grpo"]) == 0
    printed = capsys.readouterr().out
    assert "algorithm.epsilon_high" in printed and "0.2 " in printed
    assert "algorithm.max_gen_batches" not in printed  # a DAPO field
    assert "GRPOConfig" in printed


@pytest.mark.parametrize("key", ["training.eval_every_steps", "training.output_dir"])
def test_removed_duplicate_settings_are_rejected(capsys, key):
    """eval.every_steps and --output are the one name for each concept."""
    assert key not in listing("grpo")
    assert main(["train", "--algo", "grpo", f"{key}=5"]) == 2
    assert f"TrainingConfig has no field {key.split('.')[1]!r}" in capsys.readouterr().err


def test_version_and_help_point_to_the_settings(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"trainer {version('trainer')}"
    for command in ("train", "compare", "eval", "export", "bench"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        printed = capsys.readouterr().out
        assert "trainer config [--algo NAME]" in printed
        if command == "compare":
            assert f"seeds per variant (default {DEFAULT_SEEDS})" in " ".join(printed.split())


def test_opd_is_listed_with_its_defaults_and_resolved_with_overrides(capsys, tmp_path):
    """OPD's defaults need a teacher to run: the listing shows them and says so; overrides resolve it."""
    assert main(["config", "--algo", "opd"]) == 0
    printed = capsys.readouterr().out
    rows = {key: rest for key, *rest in (re.split(r"\s{2,}", line, maxsplit=3) for line in printed.splitlines()[4:])}
    assert rows["algorithm.distill_coef"][:2] == ["float", "1.0"]
    assert rows["algorithm.advantage_estimator"][:2] == ["str", "zero"]
    assert rows["algo"][:2] == ["str", "opd"]
    assert printed.rstrip().endswith("to distill from") and "To run, opd needs more than its defaults" in printed
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    assert main(["config", "--algo", "opd", f"algorithm.teacher={teacher}", "algorithm.distill_coef=0.5"]) == 0
    printed = capsys.readouterr().out
    assert "To run" not in printed
    assert re.search(r"^algorithm.distill_coef\s+float\s+0.5\s", printed, re.M)
    assert re.search(rf"^algorithm.teacher\s+str \| None\s+{teacher}", printed, re.M)
    # an override of the user's own that cannot run is refused in one line, not listed
    assert main(["config", "--algo", "opd", "algorithm.distill_coef=-1"]) == 2
    assert "distill_coef = -1" in capsys.readouterr().err


def test_algos_describes_each_algorithm_with_its_own_text(capsys):
    from trainer.cli import main as cli

    assert cli(["algos"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "On-policy distillation" in lines["opd"] and "Group Relative" not in lines["opd"]
    assert "Group Relative Policy Optimization" in lines["grpo"]
    assert len({line.split(maxsplit=2)[2] for line in lines.values()}) == len(lines)  # no two share a text
