"""Settings that cannot work fail when they are built: non-finite numbers and rules across sections.

Each bad setting goes through `trainer train` and must end with one line naming the
field and the value, before the tokenizer, any model or the warm start is built.
"""

import dataclasses
import typing

import pytest

from rl_core import registry
from rl_core.config import Config, ConfigError, _config_type
from trainer import build
from trainer.cli import main
from trainer.settings import RunSettings, build_settings


def float_fields(cls: type[Config], prefix: str) -> list[str]:
    """Dotted paths of every float field of `cls` and of its nested configs."""
    out = []
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        nested = _config_type(hint)
        if nested is not None:
            out += float_fields(nested, f"{prefix}{field.name}.")
        elif float in (typing.get_args(hint) or (hint,)):
            out.append(f"{prefix}{field.name}")
    return out


FLOAT_SETTINGS = sorted(
    {path for f in dataclasses.fields(RunSettings) if (sub := _config_type(typing.get_type_hints(RunSettings)[f.name]))
     for path in float_fields(sub, f"{f.name}.")}
    | {path for algo in ("grpo", "dr_grpo", "dapo", "ppo")
       for path in float_fields(registry.get_algorithm(algo).config, "algorithm.")}
)


def test_every_float_setting_is_found():
    # the enumeration below must not silently shrink to nothing
    assert {"training.learning_rate", "rollout.temperature", "rollout.top_p", "warm_start.learning_rate",
            "algorithm.beta", "algorithm.epsilon_high", "algorithm.overlong.penalty_factor",
            "algorithm.gamma", "algorithm.gae_lambda", "algorithm.critic_learning_rate"} <= set(FLOAT_SETTINGS)


@pytest.fixture
def nothing_is_built(monkeypatch):
    """Fail the test if a tokenizer, a model, the warm start or a learner is built."""

    def forbidden(*args, **kwargs):
        raise AssertionError("built something before the settings were checked")

    for name in ("tokenizer", "new_model", "base_policy", "learner", "warm_start"):
        monkeypatch.setattr(build, name, forbidden)


def algo_with(path: str) -> str:
    """An installed algorithm that has the setting `path`."""
    if not path.startswith("algorithm."):
        return "grpo"
    field = path.split(".")[1]
    return next(a for a in ("grpo", "dr_grpo", "dapo", "ppo")
                if field in {f.name for f in dataclasses.fields(registry.get_algorithm(a).config)})


# every spelling on every setting; the fast tier takes two spellings (YAML's .nan and an
# overflowing 1e999) on every setting, the other four run in the e2e tier
NON_FINITE = [".nan", "1e999", *(pytest.param(v, marks=pytest.mark.e2e) for v in (".inf", "-.inf", "inf", "nan"))]


@pytest.mark.parametrize("value", NON_FINITE)
@pytest.mark.parametrize("path", FLOAT_SETTINGS)
def test_non_finite_numbers_are_rejected_in_every_float_setting(path, value, capsys, tmp_path, nothing_is_built):
    algo = algo_with(path)
    out = tmp_path / "run"
    code = main(["train", "--algo", algo, "--output", str(out), f"{path}={value}"])
    err = capsys.readouterr().err
    assert code == 2
    field = path.rsplit(".", 1)[1]
    assert f".{field} = " in err and "must be a finite number" in err, err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_non_finite_task_options_are_rejected(capsys, tmp_path, nothing_is_built):
    code = main(["train", "--algo", "grpo", "--output", str(tmp_path / "r"), "task.options.teacher_slip_rate=.nan"])
    assert code == 2
    assert "TaskSettings.options.teacher_slip_rate = nan: must be a finite number" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # 4 prompts x 8 completions = 32 per step: 12 does not divide it
        (["training.prompts_per_step=4", "training.mini_batch_size=12"], "mini_batch_size = 12: must divide the completions per step (32)"),
        (["training.prompts_per_step=4", "training.mini_batch_size=16", "training.micro_batch_size=6"],
         "micro_batch_size = 6: must divide mini_batch_size (16)"),
        # the micro-batch when none is set is the mini-batch, and the group size counts: 3 x 2 = 6
        (["training.prompts_per_step=3", "algorithm.group_size=2", "training.mini_batch_size=4"],
         "mini_batch_size = 4: must divide the completions per step (6)"),
        (["rollout.temperature=0"], "RolloutConfig.temperature = 0.0: RL rollouts need temperature > 0"),
        # DAPO's overlong buffer against the rollout's length
        (["rollout.max_new_tokens=4", "algorithm.overlong.cache_tokens=8"], "cache_tokens = 8: must be in (0, max_tokens = 4]"),
        # tis_cap is the old name of rollout_correction.mode=token_tis: both set must agree
        (["algorithm.tis_cap=2.0", "algorithm.rollout_correction.mode=icepop"],
         "tis_cap = 2.0 and rollout_correction (mode='icepop', cap=5.0) both set"),
    ],
    ids=["mini-batch", "micro-batch", "group-size-counts", "greedy-rollouts", "overlong-buffer", "tis-cap-and-correction"],
)
def test_rules_across_sections_fail_before_anything_is_built(overrides, expected, capsys, tmp_path, nothing_is_built):
    algo = "dapo" if any("overlong" in o for o in overrides) else "grpo"
    out = tmp_path / "run"
    code = main(["train", "--algo", algo, "--output", str(out), *overrides])
    err = capsys.readouterr().err
    assert code == 2
    assert expected in err, err
    assert len(err.strip().splitlines()) == 1
    assert not out.exists()


QWEN2 = "tests/fixtures/hf/qwen2"  # a real Hugging Face folder, with another vocabulary than the character one


@pytest.mark.parametrize(
    ("algo", "overrides", "expected"),
    [
        ("grpo", [f"model.critic_path={QWEN2}"], "critic_path = 'tests/fixtures/hf/qwen2': algorithm 'grpo' trains no critic"),
        ("ppo", ["model.critic_path=no/such/folder"], "critic_path = 'no/such/folder': must be an existing folder"),
        ("ppo", [f"model.critic_path={QWEN2}", "model.lora.rank=4"],
         "a LoRA critic trains adapters over the policy's own frozen base"),
    ],
    ids=["no-critic-to-start", "missing-folder", "lora-shares-the-base"],
)
def test_a_critic_folder_that_cannot_be_used_fails_before_anything_is_built(algo, overrides, expected, capsys,
                                                                           tmp_path, nothing_is_built):
    out = tmp_path / "run"
    code = main(["train", "--algo", algo, "--output", str(out), *overrides])
    err = capsys.readouterr().err
    assert code == 2 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


def test_a_critic_folder_with_another_vocabulary_fails_before_the_run_folder_is_made(capsys, tmp_path):
    out = tmp_path / "run"
    code = main(["train", "--algo", "ppo", "--output", str(out), f"model.critic_path={QWEN2}", "warm_start.steps=0"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "its vocabulary has 320 tokens and the policy's 99; the critic reads the policy's tokens" in err
    assert not out.exists()


def test_micro_batches_must_divide_over_the_devices(monkeypatch):
    # one CPU device here: the rule is checked against the count jax reports, which is faked to 4
    import trainer.settings.schemas as settings_module

    monkeypatch.setattr(settings_module.jax, "device_count", lambda: 4)
    with pytest.raises(ConfigError, match=r"micro_batch_size = 6 completions: must divide evenly over 4 devices"):
        build_settings(algo="grpo", overrides=["training.prompts_per_step=3", "algorithm.group_size=2"])
    # 4 x 2 = 8 rows, micro-batches of 4: one row per device
    ok = build_settings(algo="grpo", overrides=["training.prompts_per_step=4", "algorithm.group_size=2",
                                                  "training.micro_batch_size=4"])
    assert ok.training.micro_batch_size == 4


def test_reading_settings_loads_no_engine():
    """The settings (the judge's included) are read without importing a rollout engine, a judge
    model or an evaluation: those build on the settings, never the other way round."""
    import subprocess
    import sys

    code = ("import sys, trainer.settings; print(sorted(m for m in sys.modules if m.startswith("
            "('rl_core.rollout', 'rl_core.learner', 'trainer.judge', 'trainer.evaluate', 'trainer.build'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
