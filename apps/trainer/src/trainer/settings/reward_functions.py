"""The `rewards:` section of a run's settings: registered reward functions added to the task's.

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
```

Every entry is built when the settings are read, so a typo or a bad option fails before
any model loads (docs/remote-rewards.md lists the remote rewards' options).
"""

from __future__ import annotations

import inspect
import math
import numbers
from collections.abc import Mapping
from typing import Any

from rewards import ON_ERROR_CHOICES, REWARD_FUNCTIONS, RewardSpec, make_reward
from rewards.code import CodeError, is_code_reference
from rl_core.config import ConfigError

__all__ = ["ENTRY_KEYS", "reward_specs"]

ENTRY_KEYS = ("function", "weight", "options", "data_sources", "timeout_s", "on_failure")


def reward_specs(section: Mapping[str, Any]) -> tuple[RewardSpec, ...]:
    """The `rewards:` section as RewardSpecs, in its order; a bad entry raises ConfigError naming it."""
    if not isinstance(section, Mapping):
        raise ConfigError(f"rewards must map reward names to {{function, weight, options}}, got {type(section).__name__}")
    specs = []
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
        function = entry.get("function", name)
        weight = entry.get("weight", 1.0)
        options = entry.get("options") or {}
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or not math.isfinite(weight):
            raise ConfigError(f"{where}.weight = {weight!r}: must be a finite number")
        if not isinstance(options, Mapping):
            raise ConfigError(f"{where}.options = {options!r}: must be a mapping of the function's options")
        factory = None if is_code_reference(function) else REWARD_FUNCTIONS.get(function)
        if factory is not None and "reward_name" in inspect.signature(factory).parameters:
            options = {"reward_name": name, **options}  # its own metrics carry the entry's name
        try:
            fn = make_reward(function, **options)
        except CodeError as e:
            raise ConfigError(f"{where}.function: {e}") from None
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where} (function {function!r}): {e}") from None
        sources = entry.get("data_sources")
        if sources is not None and (isinstance(sources, str) or not isinstance(sources, (list, tuple))
                                    or not all(isinstance(x, str) for x in sources)):
            raise ConfigError(f"{where}.data_sources = {sources!r}: must be a list of data_source names")
        on_failure = entry.get("on_failure")
        if on_failure is not None and on_failure not in ON_ERROR_CHOICES:
            raise ConfigError(f"{where}.on_failure = {on_failure!r}: must be one of {', '.join(ON_ERROR_CHOICES)}")
        try:
            specs.append(RewardSpec(fn, weight=float(weight), name=name, data_sources=sources,
                                    timeout_s=entry.get("timeout_s"), on_failure=on_failure))
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    return tuple(specs)
