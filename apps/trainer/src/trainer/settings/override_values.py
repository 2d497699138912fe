"""A `key=value` override's value, read by the type its setting declares.

Values are YAML scalars (`training.learning_rate=3e-4`, `rollout.stop=[a, b]`), except where YAML's
reading is not a value the setting takes and the setting takes text: there the text is kept as
written. So `training.async_rollout=off` is the string "off" (YAML 1.1 reads `off` as false, which a
str setting refuses) and `judge.template={completion}={reference}?` is that template (YAML reads a
`{` as the start of a mapping and fails), while `algorithm.tis_cap=off` still reads false and is
refused by its own check.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Sequence
from typing import Any

import yaml
from rl_core import Config, ConfigError, registry


def override_value(item: str, parts: Sequence[str], raw: str, root: type) -> Any:
    """The value of override `item` (`a.b=raw`) for the setting at `parts` under the config class `root`."""
    if not raw:
        return ""
    hints = declared_types(root, parts)
    takes_text = any(str in _members(hint) for hint in hints)
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        if takes_text:
            return raw
        problem = getattr(e, "problem", None) or " ".join(str(e).split())
        raise ConfigError(f"override {item!r}: the value is not valid YAML ({problem}); write text in quotes, "
                          f"e.g. {parts[-1]}='\"...\"'") from None
    if takes_text and not any(_fits(value, hint) for hint in hints):
        return raw
    return value


def declared_types(root: type, parts: Sequence[str]) -> list[Any]:
    """The type hints the setting at `parts` is declared with under `root`; `algorithm.*` is looked up in
    every installed algorithm's config (a field has one type wherever it is declared). Empty when no
    class declares it (free-form sections: `task.options.*`, `rewards.*`, or a typo the settings refuse)."""
    if not parts:
        return []
    hints = typing.get_type_hints(root)
    fields = {f.name for f in dataclasses.fields(root)}
    head, rest = parts[0], parts[1:]
    if head not in fields:
        return []
    if root.__name__ == "RunSettings" and head == "algorithm":
        out = []
        for name in registry.registry.names("algorithm"):
            out += declared_types(registry.get_algorithm(name).config, rest)
        return out
    hint = hints[head]
    if not rest:
        return [hint]
    configs = [h for h in _members(hint) if isinstance(h, type) and issubclass(h, Config)]
    return [t for cls in configs for t in declared_types(cls, rest)]


def _members(hint: Any) -> tuple[Any, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _fits(value: Any, hint: Any) -> bool:
    """Whether YAML's reading `value` is one a setting declared `hint` takes."""
    for h in _members(hint):
        if h is Any or (h is type(None) and value is None):
            return True
        origin = typing.get_origin(h) or h
        if not isinstance(origin, type):
            continue
        if origin is float and isinstance(value, int) and not isinstance(value, bool):
            return True
        if origin in (tuple, list) and isinstance(value, list):
            return True
        if isinstance(value, bool) and origin is not bool:
            continue
        if isinstance(value, origin):
            return True
    return False
