"""trainer CLI: parsing, validation messages, `algos` / `tasks`, and how settings are layered.

Everything here fails (or lists) before any model is built, so the tests call
`trainer.cli.main` in-process and read what it printed.
"""

import dataclasses
import json
import re

import pytest
import yaml

from rl_core import registry as registry_module
from rl_core.config import ConfigError
from rl_core.registry import Algorithm, Registry
from trainer.cli import main
from trainer.settings import DEFAULT_TRAINING, build_settings, merge, parse_overrides


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# -- rejected before anything is built --------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        # a misspelled field: the closest valid key is named
        (["--algo", "grpo", "training.learning_rat=1"], ["'learning_rat'", "did you mean 'learning_rate'?"]),
        # a misspelled section
        (["--algo", "grpo", "trainin.x=1"], ["'trainin'", "did you mean 'training'?"]),
        # a misspelled field of the algorithm's own config
        (["--algo", "grpo", "algorithm.group_sze=4"], ["GRPOConfig", "did you mean 'group_size'?"]),
        # wrong type: the field, the value and the expected type
        (["--algo", "grpo", "training.num_steps=abc"], ["TrainingConfig.num_steps = 'abc'", "must be int"]),
        # YAML booleans are not ints
        (["--algo", "grpo", "training.num_steps=true"], ["TrainingConfig.num_steps = True", "must be int"]),
        # invalid value: the field, the value and the rule
        (["--algo", "grpo", "rollout.top_p=2"], ["RolloutConfig.top_p = 2.0", "must be in (0, 1]"]),
        (["--algo", "grpo", "eval.heldout_size=0"], ["EvalSettings.heldout_size = 0", "must be >= 1"]),
        (["--algo", "grpo", "algorithm.group_size=1"], ["GRPOConfig.group_size = 1", "must be >= 2"]),
        # an unknown algorithm: what is installed and the closest name
        (["--algo", "dr_grp"], ["unknown algorithm 'dr_grp'", "Did you mean 'dr_grpo'?", "grpo", "dapo"]),
        # an override that is not key=value
        (["--algo", "grpo", "num_steps"], ["override 'num_steps'", "expected key=value"]),
        # a section given a plain value instead of its fields
        (["--algo", "grpo", "training=5"], ["training", "5", "mapping"]),
        (["--algo", "grpo", "task=countdown"], ["task", "'countdown'", "mapping"]),
        (["--algo", "dapo", "algorithm.overlong=false"], ["overlong", "False", "mapping"]),
        # a task that does not exist, and a task option it does not take
        (["--algo", "grpo", "task.name=arithmetik"], ["TaskSettings.name = 'arithmetik'", "arithmetic"]),
        (["--algo", "grpo", "task.options.digitz=2"], ["task.options.digitz", "did you mean 'task.options.digits'"]),
        # neither --algo nor --resume
        ([], ["--algo NAME", "--resume DIR"]),
    ],
    ids=[
        "field-typo",
        "section-typo",
        "algorithm-field-typo",
        "not-an-int",
        "bool-is-not-int",
        "top_p-out-of-range",
        "heldout-size-0",
        "group-size-1",
        "algorithm-typo",
        "not-key-value",
        "section-as-int",
        "task-as-string",
        "nested-section-as-bool",
        "task-typo",
        "task-option-typo",
        "no-algo",
    ],
)
def test_train_rejects_bad_settings_with_a_message(capsys, tmp_path, argv, expected):
    code, out, err = run_cli(capsys, "train", "--output", str(tmp_path / "run"), *argv)
    assert code == 2
    assert err.startswith("trainer train: error: ")
    for text in expected:
        assert text in err, f"{text!r} not in {err!r}"
    assert out == ""
    assert not (tmp_path / "run").exists()  # nothing was built or written


def test_yaml_file_with_an_unknown_key(capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("training:\n  num_steps: 3\n  learnig_rate: 0.01\n")
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--config", str(config))
    assert code == 2
    assert "'learnig_rate'" in err
    assert "did you mean 'learning_rate'?" in err


def test_yaml_file_with_an_unknown_section(capsys, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("rolout:\n  temperature: 0.5\n")
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--config", str(config))
    assert code == 2
    assert "'rolout'" in err
    assert "did you mean 'rollout'?" in err


@pytest.mark.parametrize(("text", "kind"), [("- 1\n- 2\n", "list"), ("just a string\n", "str")])
def test_yaml_file_that_is_not_a_mapping(capsys, tmp_path, text, kind):
    config = tmp_path / "run.yaml"
    config.write_text(text)
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--config", str(config))
    assert code == 2
    assert str(config) in err
    assert f"must hold a mapping at the top level, got {kind}" in err


def test_yaml_file_that_does_not_parse_or_exist(capsys, tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("training: {num_steps: 3\n")
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--config", str(broken))
    assert code == 2
    assert "is not valid YAML" in err

    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--config", str(tmp_path / "missing.yaml"))
    assert code == 2
    assert "missing.yaml" in err
    assert "does not exist" in err


def test_resume_of_a_missing_folder(capsys, tmp_path):
    code, _, err = run_cli(capsys, "train", "--resume", str(tmp_path / "nope"), "--no-progress")
    assert code == 2
    assert str(tmp_path / "nope") in err
    assert "config.yaml is missing" in err


@pytest.mark.parametrize(
    "extra",
    [
        ["training.learning_rate=0.1"],
        ["training.num_steps=9", "rollout.seed=1"],  # only num_steps may change (it extends the run)
        ["--algo", "dapo"],
        ["--overwrite"],
    ],
)
def test_resume_refuses_new_settings(capsys, tmp_path, extra):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"algo": "grpo"}))
    code, _, err = run_cli(capsys, "train", "--resume", str(run), *extra)
    assert code == 2
    assert "saved settings" in err and "training.num_steps=N" in err


def test_compare_rejects_an_unknown_algorithm_before_running_anything(capsys, tmp_path):
    code, out, err = run_cli(capsys, "compare", "dr_grp", "training.num_steps=1", "--output", str(tmp_path / "c"))
    assert code == 2
    assert err.startswith("trainer compare: error: ")
    assert "Did you mean 'dr_grpo'?" in err
    assert not (tmp_path / "c").exists()


def test_compare_rejects_a_bad_override_for_every_variant(capsys, tmp_path):
    code, _, err = run_cli(capsys, "compare", "grpo", "--set", "rollout.temprature=0.5", "--output", str(tmp_path))
    assert code == 2
    assert "did you mean 'temperature'?" in err


def test_overrides_may_follow_options(capsys, tmp_path):
    """`train --algo grpo a=1 --no-progress b=2` and `compare grpo --output DIR a=1`: every override counts."""
    code, _, err = run_cli(
        capsys, "train", "--algo", "grpo", "training.num_steps=2", "--no-progress", "training.learning_rat=1"
    )
    assert code == 2
    assert "did you mean 'learning_rate'?" in err
    code, _, err = run_cli(
        capsys, "compare", "grpo", "--output", str(tmp_path / "c"), "dr_grp", "--no-progress", "training.num_steps=1"
    )
    assert code == 2
    assert "Did you mean 'dr_grpo'?" in err


@pytest.mark.parametrize("argv", [["train", "--algo", "grpo", "--outptu", "x"], ["algos", "extra"]])
def test_unknown_arguments_are_argparse_errors(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_unknown_command_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["trian"])
    assert exit_info.value.code == 2
    assert "invalid choice: 'trian'" in capsys.readouterr().err


# -- what is installed --------------------------------------------------------------------------


def test_algos_lists_every_installed_algorithm_with_its_distribution(capsys):
    code, out, err = run_cli(capsys, "algos")
    assert code == 0
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines() if line and not line.startswith("(")}
    names = ["grpo", "dr_grpo", "dapo", "rloo", "gspo", "cispo", "reinforce_pp", "ppo", "sapo", "dppo", "opd"]
    assert rows == {name: "algo-" + name.replace("_", "-") for name in names}
    assert "Group Relative Policy Optimization" in out
    assert "failed to load" not in out


def test_algos_lists_an_algorithm_whose_learner_has_no_docstring(capsys, monkeypatch):
    """A plugin's learner may be a bare subclass; `trainer algos` still lists it."""
    from algo_grpo import GRPOConfig, GRPOLearner

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class PlainConfig(GRPOConfig):
        """A config with a docstring."""

    class PlainLearner(GRPOLearner):
        pass

    reg = Registry()
    reg.register_algorithm(Algorithm(name="plain", config=PlainConfig, learner=PlainLearner), provider="algo-plain")
    monkeypatch.setattr(registry_module, "registry", reg)
    code, out, _ = run_cli(capsys, "algos")
    assert code == 0
    names = [line.split()[0] for line in out.splitlines()]
    assert names == [
        "cispo", "dapo", "dppo", "dr_grpo", "grpo", "gspo", "opd", "plain", "ppo", "reinforce_pp", "rloo", "sapo"
    ]
    assert "algo-plain" in out


def test_tasks_lists_the_built_in_tasks(capsys):
    code, out, _ = run_cli(capsys, "tasks")
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines()}
    assert {"arithmetic", "countdown"} <= set(rows)
    assert "500 held-out" in rows["arithmetic"]  # the fixed held-out split
    assert "500 held-out" in rows["countdown"]


# -- parse_overrides / merge / build_settings ---------------------------------------------------


def test_parse_overrides_nests_dotted_keys_and_reads_yaml_scalars():
    parsed = parse_overrides(
        ["training.num_steps=5", "training.learning_rate=0.01", "algorithm.beta=0", "rollout.seed=7",
         "task.name=countdown", "algorithm.dual_clip=null", "eval.heldout_size=", "algorithm.overlong.enabled=false"]
    )
    assert parsed == {
        "training": {"num_steps": 5, "learning_rate": 0.01},
        "algorithm": {"beta": 0, "dual_clip": None, "overlong": {"enabled": False}},
        "rollout": {"seed": 7},
        "task": {"name": "countdown"},
        "eval": {"heldout_size": ""},
    }
    # a value with '=' in it keeps everything after the first '='
    assert parse_overrides(["task.name=a=b"]) == {"task": {"name": "a=b"}}


@pytest.mark.parametrize(
    ("items", "message"),
    [
        (["num_steps"], "expected key=value"),
        (["=3"], "expected key=value"),
        (["training=1", "training.num_steps=2"], "set both as a value and as a section"),
    ],
)
def test_parse_overrides_rejects(items, message):
    with pytest.raises(ConfigError, match=message):
        parse_overrides(items)


def test_merge_is_deep_and_leaves_its_inputs_alone():
    base = {"training": {"num_steps": 300, "learning_rate": 1e-3}, "algo": "grpo"}
    top = {"training": {"num_steps": 5}, "rollout": {"seed": 1}}
    merged = merge(base, top)
    assert merged == {"training": {"num_steps": 5, "learning_rate": 1e-3}, "algo": "grpo", "rollout": {"seed": 1}}
    assert base == {"training": {"num_steps": 300, "learning_rate": 1e-3}, "algo": "grpo"}
    assert top == {"training": {"num_steps": 5}, "rollout": {"seed": 1}}
    # a non-mapping on top replaces a mapping below (validation reports it later)
    assert merge({"a": {"b": 1}}, {"a": 2}) == {"a": 2}


def test_build_settings_layers_task_defaults_then_yaml_then_overrides(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "algo": "dapo",
                "task": {"name": "countdown"},
                "training": {"num_steps": 7, "learning_rate": 0.02},
                "rollout": {"max_new_tokens": 12, "temperature": 0.7},
                "algorithm": {"group_size": 4},
            }
        )
    )
    settings = build_settings(
        algo="grpo", config_file=config, overrides=["rollout.max_new_tokens=10", "training.learning_rate=3e-4"]
    )
    assert settings.algo == "grpo"  # --algo beats the YAML's algo
    assert settings.task.name == "countdown"
    assert settings.rollout.max_prompt_tokens == 32  # countdown's default: the YAML named the task
    assert settings.rollout.max_new_tokens == 10  # task 16 < YAML 12 < override 10
    assert settings.rollout.temperature == 0.7  # YAML
    assert settings.training.num_steps == 7  # YAML over the trainer's default 300
    assert settings.training.learning_rate == 3e-4  # '3e-4' is a YAML string; float fields parse it
    assert settings.training.prompts_per_step == DEFAULT_TRAINING["prompts_per_step"]
    assert settings.algorithm_config().group_size == 4
    assert settings.algorithm_config().beta == 0.04  # GRPO's default, not DAPO's


def test_build_settings_defaults_come_from_the_task():
    arithmetic = build_settings(algo="grpo")
    assert (arithmetic.rollout.max_prompt_tokens, arithmetic.rollout.max_new_tokens) == (7, 5)
    assert arithmetic.training.num_steps == DEFAULT_TRAINING["num_steps"]
    countdown = build_settings(algo="grpo", overrides=["task.name=countdown"])
    assert (countdown.rollout.max_prompt_tokens, countdown.rollout.max_new_tokens) == (32, 16)
    one_digit = build_settings(algo="grpo", overrides=["task.options.digits=1", "task.options.heldout_size=20"])
    assert (one_digit.rollout.max_prompt_tokens, one_digit.rollout.max_new_tokens) == (5, 4)


def test_resolved_settings_round_trip_through_yaml(tmp_path):
    """What `train` saves beside a run builds the same settings again (this is what --resume reads)."""
    settings = build_settings(algo="dapo", overrides=["task.name=countdown", "algorithm.overlong.cache_tokens=3"])
    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(settings.resolved(), sort_keys=False))
    again = build_settings(config_file=saved)
    assert again.resolved() == settings.resolved()
    assert again.algorithm_config() == settings.algorithm_config()


@pytest.mark.parametrize("primary", [True, False])
def test_only_process_0_prints_the_summary(capsys, tmp_path, monkeypatch, primary):
    """In a multi-process run every process runs `train`; one summary is printed, process 0's."""
    import trainer.run
    from rl_core.runtime import multihost

    summary = {"algo": "grpo", "steps": 1, "before": {"eval/accuracy": 0.5}, "after": {"eval/accuracy": 0.75}}
    monkeypatch.setattr(trainer.run, "train_run", lambda *args, **kwargs: summary)
    monkeypatch.setattr(multihost, "is_primary", lambda: primary)
    code, out, err = run_cli(capsys, "train", "--algo", "grpo", "--output", str(tmp_path / "run"), "warm_start.steps=0")
    assert code == 0, err
    assert (out.strip() and json.loads(out) == summary) if primary else out == ""


def test_a_run_says_which_folder_it_writes(capsys, tmp_path, monkeypatch):
    """Without --output the trainer names the run folder itself (runs/<algo>-<date>-<time>); the run's
    second line says which (stopped here right after, where the task would load)."""

    def stop(*args, **kwargs):
        raise RuntimeError("stopped after the first lines")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("trainer.run.train.load_task", stop)
    with pytest.raises(RuntimeError, match="stopped after the first lines"):
        main(["train", "--algo", "grpo", "model.preset=tiny"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("grpo: JAX ")
    assert re.fullmatch(r"grpo: run folder runs/grpo-\d{8}-\d{6}", lines[1]), lines
