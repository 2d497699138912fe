"""`key=value` overrides: values read by the type their setting declares, bad ones refused in one line."""

import pytest

from rl_core.config import ConfigError
from trainer.cli import main
from trainer.settings import build_settings, parse_overrides


@pytest.mark.parametrize(("override", "path", "value"), [
    # YAML 1.1 reads these words as booleans; each setting takes text, so the word is kept
    ("training.async_rollout=off", ("training", "async_rollout"), "off"),
    ("rollout.partial_rollouts=off", ("rollout", "partial_rollouts"), "off"),
    ("algorithm.rollout_correction.mode=off", ("algorithm", "rollout_correction", "mode"), "off"),
    ("task.long_prompts=no", ("task", "long_prompts"), "no"),
    # a template YAML would read as a broken mapping is that template
    ("judge.template={completion}={reference}?", ("judge", "template"), "{completion}={reference}?"),
    # quoting still works, and a number given to a text setting stays its text
    ('training.async_rollout="off"', ("training", "async_rollout"), "off"),
    ("model.preset=123", ("model", "preset"), "123"),
    # where YAML's reading is one the setting takes, it is the value
    ("training.learning_rate=0.0003", ("training", "learning_rate"), 3e-4),
    ("training.num_steps=7", ("training", "num_steps"), 7),
    ("model.remat=false", ("model", "remat"), False),  # str | bool: the bool
    ("model.path=null", ("model", "path"), None),  # str | None: null is None
    ("algorithm.tis_cap=off", ("algorithm", "tis_cap"), False),  # float | None takes no text: its check refuses it
    ("task.options.answer_field=off", ("task", "options", "answer_field"), False),  # a free-form section: YAML's
])
def test_values_are_read_by_the_type_the_setting_declares(override, path, value):
    node = parse_overrides([override])
    for part in path:
        node = node[part]
    assert node == value and type(node) is type(value)


def test_off_runs_where_the_guides_write_it():
    settings = build_settings(algo="grpo", overrides=["algorithm.rollout_correction.mode=off",
                                                      "training.async_rollout=off", "training.learning_rate=3e-4"])
    assert settings.algorithm_config().rollout_correction.mode == "off"
    assert settings.training.async_rollout == "off"
    assert settings.training.learning_rate == 3e-4  # YAML 1.1 reads 3e-4 as text; the float setting converts it


def test_a_value_yaml_cannot_read_for_a_setting_without_text_is_one_line(capsys):
    with pytest.raises(ConfigError, match=r"override 'training.num_steps=\{3': the value is not valid YAML"):
        parse_overrides(["training.num_steps={3"])
    assert main(["train", "--algo", "grpo", "training.num_steps=[1"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "training.num_steps=[1" in err and "Traceback" not in err
