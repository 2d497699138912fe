"""The `rewards:` section of a run's settings: the rewards added to the task's, of three kinds.

```yaml
rewards:
  served:                    # the reward's name, in metrics: rewards/served/mean
    function: remote_score   # a registered name (rewards.REWARD_FUNCTIONS; default: the entry's name)
    weight: 0.5              # multiplies its scores in the total (default 1)
    options: {url: "http://127.0.0.1:8000/score", fields: [answer], on_failure: skip}
  mine:
    function: my_rewards.py:exact    # or my_package.rewards:exact: your own function (TRL's signature)
    data_sources: [gsm8k]            # only rows whose data_source is one of these (default: every row)
    timeout_s: 10                    # a call still running then fails (default: no limit)
    on_failure: skip                 # raise (default), zero or skip: what a failed score does
  api:
    kind: remote                     # a JSON scoring service: remote_score's options
    options: {url: "http://127.0.0.1:8000/score"}
  helpful:
    kind: judge                      # a judge model: the options of the judge: section (a model loaded here) ...
    options: {path: models/judge, template: "{prompt}{completion} vs {reference}?", verdict: yes_no}
  served_judge:
    kind: judge                      # ... or, with a url, an OpenAI-compatible judge service (remote_judge's options)
    options: {url: "http://127.0.0.1:8000/v1/chat/completions", model: judge}
```

`kind` is `function` (the default: `function` names it), `remote` or `judge`; every kind takes
`weight`, `data_sources`, `timeout_s` and `on_failure`, and all go through the one reward manager.
The top-level `judge:` section is the same judge kind under the name `judge.name` (a task such as
number_words sets its defaults). Every entry is built or checked when the settings are read, so a
typo or a bad option fails before any model loads (docs/remote-rewards.md lists the remote
rewards' options); a judge model is loaded with the run's model (trainer.judge.reward).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import numbers
from collections.abc import Mapping
from typing import Any

from rewards import ON_ERROR_CHOICES, REWARD_FUNCTIONS, RewardSpec, make_reward
from rewards.code import CodeError, is_code_reference
from rl_core import ConfigError

from trainer.settings.judge import JudgeSettings

__all__ = ["ENTRY_KEYS", "KINDS", "ModelJudge", "model_judges", "reward_specs"]

ENTRY_KEYS = ("kind", "function", "weight", "options", "data_sources", "timeout_s", "on_failure")
KINDS = ("function", "remote", "judge")
"""function: a registered name or your code; remote: a JSON scoring service (remote_score); judge: a judge
model, loaded by the trainer (path, run or train_steps) or served (url: remote_judge)."""


@dataclasses.dataclass(frozen=True)
class ModelJudge:
    """A judge model the trainer loads (kind judge without a url, or the `judge:` section), as a reward entry."""

    name: str
    settings: JudgeSettings
    weight: float = 1.0
    data_sources: tuple[str, ...] | None = None
    timeout_s: float | None = None
    on_failure: str | None = None


def reward_specs(section: Mapping[str, Any]) -> tuple[RewardSpec, ...]:
    """The `rewards:` section as RewardSpecs, in its order, less its judge models (`model_judges`, loaded with
    the run's model, checked here); a bad entry raises ConfigError naming it."""
    return tuple(spec for spec in (_entry(name, entry) for name, entry in _entries(section)) if spec is not None)


def model_judges(section: Mapping[str, Any], judge: JudgeSettings) -> tuple[ModelJudge, ...]:
    """The judge models of the `rewards:` section (kind judge without a url), after the `judge:` section's when it
    names a model."""
    own = (ModelJudge(judge.name, judge, judge.weight),) if judge.on else ()
    return own + tuple(_model_judge(name, entry) for name, entry in _entries(section) if _is_model_judge(entry))


def _entries(section: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    if not isinstance(section, Mapping):
        raise ConfigError(f"rewards must map reward names to {{function, weight, options}}, got {type(section).__name__}")
    out = []
    for name, entry in section.items():
        where = f"rewards.{name}"
        if not isinstance(name, str) or not name.replace("_", "a").replace("-", "a").isalnum():
            raise ConfigError(f"{where}: a reward's name is letters, digits, - and _ (it names metrics)")
        entry = {} if entry is None else entry
        if not isinstance(entry, Mapping):
            raise ConfigError(f"{where} = {entry!r}: must be a mapping with keys {', '.join(ENTRY_KEYS)}")
        unknown = [key for key in entry if key not in ENTRY_KEYS]
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: not a key of a reward entry (its keys: {', '.join(ENTRY_KEYS)})")
        kind = entry.get("kind", "function")
        if kind not in KINDS:
            raise ConfigError(f"{where}.kind = {kind!r}: must be one of {', '.join(KINDS)}")
        if kind != "function" and "function" in entry:
            raise ConfigError(f"{where}.function: a reward of kind {kind} names no function (its options say what "
                              "it calls); drop function: or kind:")
        options = entry.get("options") or {}
        if not isinstance(options, Mapping):
            raise ConfigError(f"{where}.options = {options!r}: must be a mapping of the {kind}'s options")
        out.append((name, entry))
    return out


def _is_model_judge(entry: Mapping[str, Any]) -> bool:
    return entry.get("kind") == "judge" and "url" not in (entry.get("options") or {})


def _common(name: str, entry: Mapping[str, Any]) -> dict[str, Any]:
    """The keys every kind takes: weight, data_sources, timeout_s, on_failure, checked."""
    where = f"rewards.{name}"
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
        raise ConfigError(f"{where}.weight = {weight!r}: must be a finite number")
    sources = entry.get("data_sources")
    if sources is not None and (isinstance(sources, str) or not isinstance(sources, (list, tuple))
                                or not all(isinstance(x, str) for x in sources)):
        raise ConfigError(f"{where}.data_sources = {sources!r}: must be a list of data_source names")
    on_failure = entry.get("on_failure")
    if on_failure is not None and on_failure not in ON_ERROR_CHOICES:
        raise ConfigError(f"{where}.on_failure = {on_failure!r}: must be one of {', '.join(ON_ERROR_CHOICES)}")
    timeout_s = entry.get("timeout_s")
    if timeout_s is not None and (isinstance(timeout_s, bool) or not isinstance(timeout_s, numbers.Real)
                                  or not timeout_s > 0):
        raise ConfigError(f"{where}.timeout_s = {timeout_s!r}: must be a number of seconds > 0")
    return {"weight": float(weight), "data_sources": tuple(sources) if sources is not None else None,
            "timeout_s": timeout_s, "on_failure": on_failure}


def _model_judge(name: str, entry: Mapping[str, Any]) -> ModelJudge:
    where = f"rewards.{name}"
    options = dict(entry.get("options") or {})
    for key in ("name", "weight"):
        if key in options:
            raise ConfigError(f"{where}.options.{key}: a judge entry's {key} is the entry's own ({where}"
                              f"{'' if key == 'name' else '.weight'})")
    common = _common(name, entry)
    try:
        settings = JudgeSettings.from_dict({**options, "name": name, "weight": common["weight"]})
    except ConfigError as e:
        raise ConfigError(f"{where} (kind judge): {e}") from None
    if not settings.on:
        raise ConfigError(f"{where} (kind judge): name its model: options.path (a model folder), options.run (a run "
                          "folder), options.train_steps (a judge trained on the task's examples) or options.url (a "
                          "served judge)")
    return ModelJudge(name, settings, **common)


def _entry(name: str, entry: Mapping[str, Any]) -> RewardSpec | None:
    """The entry's RewardSpec; None for a judge model (checked here, loaded with the run's model)."""
    where = f"rewards.{name}"
    if _is_model_judge(entry):
        _model_judge(name, entry)
        return None
    kind = entry.get("kind", "function")
    function = {"function": entry.get("function", name), "remote": "remote_score", "judge": "remote_judge"}[kind]
    options = entry.get("options") or {}
    common = _common(name, entry)
    factory = None if is_code_reference(function) else REWARD_FUNCTIONS.get(function)
    if factory is not None and "reward_name" in inspect.signature(factory).parameters:
        options = {"reward_name": name, **options}  # its own metrics carry the entry's name
    try:
        fn = make_reward(function, **options)
    except CodeError as e:
        raise ConfigError(f"{where}.function: {e}") from None
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where} ({f'kind {kind}' if kind != 'function' else f'function {function!r}'}): {e}") from None
    try:
        return RewardSpec(fn, name=name, **common)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None
