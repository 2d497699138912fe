"""Loading the run settings: YAML plus dotted command-line overrides, validated.

A run is described by one `RunSettings` (trainer.settings.schemas). Building it:
  1. the task's lengths seed `rollout.max_prompt_tokens` / `max_new_tokens` (a multi-turn
     task's environment and turn limits seed `rollout.environment`, `max_turns`, ...);
  2. the YAML file (if any) is merged on top;
  3. `key=value` overrides (dotted, e.g. `training.learning_rate=3e-4`) last.
Unknown keys are rejected with the closest valid key, wrong types and broken
rules with the field, the value and the rule, all before any model is built.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from rl_core import ConfigError
from rl_core.run import storage

from trainer.settings.override_values import override_value
from trainer.settings.reward_functions import model_judges, reward_specs
from trainer.settings.schemas import DEFAULT_TRAINING, RunSettings, TaskSettings
from trainer.tasks import DataError, FileTask, sized_lengths, task_factory
from trainer.tasks.data_task import EVAL_TASK_OPTIONS, evaluation_set, sft_set


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """`a.b=1` items into a nested dict; values are YAML scalars, or the text as written where the
    setting takes text and YAML's reading is not one it takes (`override_values`)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r}: expected key=value, e.g. training.learning_rate=3e-4")
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r}: {part!r} is set both as a value and as a section")
        node[parts[-1]] = override_value(item, parts, raw, RunSettings)
    return out


def merge(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: dicts merge key by key, anything else in `top` replaces."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML's safe loader, but a key given twice in one mapping is an error (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            try:
                if key in first:
                    raise ConfigError(
                        f"line {line}: key {key!r} is set twice in one mapping (first on line {first[key]}); "
                        "YAML would keep only the last, so remove one"
                    )
                first[key] = line
            except TypeError:  # an unhashable key: the constructor below reports it
                pass
        return super().construct_mapping(node, deep)


def load_yaml(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML settings file (a path or a URL); every way it can be unreadable is one ConfigError line."""
    where = f"config file {str(path)!r}"
    if not storage.is_url(path) and Path(path).is_dir():
        raise ConfigError(f"{where} is a folder; --config takes a YAML file")
    try:
        raw = storage.read_bytes(path) if storage.is_url(path) else Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{where} cannot be read: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise ConfigError(
            f"{where} is not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line}); settings files are "
            "UTF-8 YAML"
        ) from None
    if "\x00" in text:
        raise ConfigError(f"{where} is not a text file (it holds NUL bytes); settings files are UTF-8 YAML")
    try:
        data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError as e:
        raise ConfigError(f"{where}, {e}") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise ConfigError(f"{where} is not valid YAML{at}: {what}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{where} is not valid YAML: {' '.join(str(e).split())}") from None
    if data is None:
        raise ConfigError(
            f"{where} holds no settings (it is empty or only comments); give it some, e.g. "
            "`training: {num_steps: 50}`, or leave out --config to run on the defaults"
        )
    if not isinstance(data, dict):
        raise ConfigError(f"{where} must hold a mapping at the top level, got {type(data).__name__}")
    return data


def build_settings(
    *, algo: str | None = None, config_file: str | Path | None = None, overrides: Sequence[str] = ()
) -> RunSettings:
    """Task defaults < YAML < overrides (< --algo), validated into `RunSettings`."""
    return settings_from_user(user_settings(config_file, overrides), algo)


def user_settings(config_file: str | Path | None = None, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """What the user set: the YAML file with the overrides merged on top (not validated yet)."""
    user = load_yaml(config_file) if config_file else {}
    return merge(user, parse_overrides(overrides))


def settings_from_user(user: Mapping[str, Any], algo: str | None = None) -> RunSettings:
    """`user_settings` over the defaults, validated into `RunSettings`."""
    user = dict(user)
    if algo is not None:
        user["algo"] = algo
    _reject_unknown(user)
    task_section = dict(user.get("task") or {})
    if "name" not in task_section and "data" in (task_section.get("options") or {}):
        task_section["name"] = "data"  # --data FILE alone: rows of any shape (trainer.tasks.rows)
        user["task"] = task_section
    task_settings = TaskSettings.from_dict(task_section)
    problems = []  # a data error and a missing model are both told at once, not one after the other
    try:
        task = task_settings.build()
    except (ConfigError, DataError) as e:
        problems.append(str(e))
    # a task read through the chat template (GSM8K, MATH rows) needs a tokenizer that has one; told beside a
    # data error, so a file task's factory says so before its rows are read
    templated = task.chat is True if not problems else isinstance(task_factory(task_settings.name), FileTask)
    if templated and not (user.get("model") or {}).get("path"):
        problems.append(
            f"task.name = {task_settings.name!r} needs a model folder whose tokenizer has a chat template: "
            "pass --model DIR (model.path=DIR)"
        )
    if not problems and not task.rewards and not user.get("rewards") \
            and not any((user.get("judge") or {}).get(k) for k in ("path", "run", "train_steps")):
        problems.append(
            f"the rows of {task_settings.options.get('data')!r} carry no reference answer (column answer, solution, "
            "reward_model.ground_truth or a final assistant turn) and no reward scores them: pass "
            "task.options.reward=my_rewards.py:my_function or add a rewards: entry"
        )
    if problems:
        raise ConfigError("; and ".join(problems))
    lengths = {"max_prompt_tokens": task.max_prompt_tokens, "max_new_tokens": task.max_new_tokens}
    sized = sized_lengths(task, (user.get("model") or {}).get("path"))
    warm_data = (user.get("warm_start") or {}).get("data")
    if sized and isinstance(warm_data, str):  # the warm start's own rows must fit the lengths too
        try:
            sft = sft_set(warm_data, **{k: v for k, v in task_settings.options.items()
                                        if k in EVAL_TASK_OPTIONS and k != "reward"})
        except (DataError, ValueError) as e:
            raise ConfigError(f"warm_start.data: {e}") from None
        sized = {key: max(n, sized_lengths(sft, None)[key]) for key, n in sized.items()}
    defaults = {
        "training": dict(DEFAULT_TRAINING),
        "rollout": lengths | sized,
    }
    if task.environment is not None:  # a multi-turn task brings its environment and turn limits
        defaults["rollout"].update(environment=task.environment, environment_options=dict(task.environment_options),
                                   max_turns=task.max_turns, max_turn_tokens=task.max_turn_tokens)
    if task.judge:  # a task judged by a model brings its judge's settings; a judge the user names replaces its own
        named = isinstance(user.get("judge"), Mapping) and any(user["judge"].get(k) for k in ("path", "run"))
        defaults["judge"] = {k: v for k, v in task.judge.items() if not (named and k == "train_steps")}
    settings = RunSettings.from_dict(merge(defaults, user))
    inherited = {k: v for k, v in settings.task.options.items() if k in EVAL_TASK_OPTIONS} \
        if settings.task.name == "data" else {}
    if settings.warm_start.data is not None:  # read now: a bad file fails before any model loads
        try:
            sft_set(settings.warm_start.data, **{k: v for k, v in inherited.items() if k != "reward"})
        except (DataError, ValueError) as e:
            raise ConfigError(f"warm_start.data: {e}") from None
    for name, entry in settings.eval.sets.items():  # read now: a bad file fails before any model loads
        try:
            evaluation_set(entry["data"], **(inherited | {k: v for k, v in entry.items() if k in ("reward", "split")}))
        except (DataError, ValueError) as e:
            raise ConfigError(f"eval.sets.{name}: {e}") from None
    config = settings.algorithm_config()
    own = config.reward_functions(max_new_tokens=settings.rollout.max_new_tokens)
    judges = [j.name for j in model_judges(settings.rewards, settings.judge)]
    names = [*(spec.name for spec in task.rewards), *judges, *(spec.name for spec in reward_specs(settings.rewards))]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"rewards: {twice} named twice (the task's rewards are {[s.name for s in task.rewards]}); "
                          "give the entry another name and set its function: explicitly")
    config.check_reward_names([*names, *(fn.__name__ for fn in own)])
    return settings


def _reject_unknown(data: Mapping[str, Any]) -> None:
    """Top-level keys are checked here so the message shows the closest one."""
    fields = [f.name for f in dataclasses.fields(RunSettings)]
    sections = [f.name for f in dataclasses.fields(RunSettings) if f.default_factory is not dataclasses.MISSING]
    for key, value in data.items():
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else "."
            raise ConfigError(f"unknown setting {key!r}{hint} Valid sections: {', '.join(fields)}")
        if key in sections and not isinstance(value, Mapping):
            raise ConfigError(
                f"RunSettings.{key} = {value!r}: must be a mapping of settings "
                f"(set its fields, e.g. {key}.<field>=...), got {type(value).__name__}"
            )
