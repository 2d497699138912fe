"""The `rewards:` section of a run's settings: registered reward functions added to the task's.

```yaml
rewards:
  served:                    # the reward's name, in metrics: rewards/served/mean
    function: remote_score   # a name of rewards.REWARD_FUNCTIONS (default: the entry's name)
    weight: 0.5              # multiplies its scores in the total (default 1)
    options: {url: "http://127.0.0.1:8000/score", fields: [answer], on_failure: skip}
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

from rewards import REWARD_FUNCTIONS, RewardSpec, make_reward
from rl_core.config import ConfigError

__all__ = ["ENTRY_KEYS", "reward_specs"]

ENTRY_KEYS = ("function", "weight", "options")


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
        factory = REWARD_FUNCTIONS.get(function)
        if factory is not None and "reward_name" in inspect.signature(factory).parameters:
            options = {"reward_name": name, **options}  # its own metrics carry the entry's name
        try:
            fn = make_reward(function, **options)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where} (function {function!r}): {e}") from None
        specs.append(RewardSpec(fn, weight=float(weight), name=name))
    return tuple(specs)
