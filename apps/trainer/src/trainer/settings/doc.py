"""`trainer config`: every setting with its type, default and one-line description.

The descriptions are the configs' own attribute docstrings (read from the
source with `ast`), so this listing cannot drift from the code; the defaults
are the trainer's resolved ones (task lengths, the trainer's training defaults,
the algorithm's config).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import types
import typing
from collections.abc import Sequence
from typing import Any

from rl_core import Config, ConfigError, registry

from trainer.settings.loading import settings_from_user, user_settings
from trainer.settings.schemas import RunSettings


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """{field: docstring} from the attribute docstrings of `cls` and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # no source (e.g. defined in a REPL): no descriptions
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def type_name(hint: Any) -> str:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return " | ".join(type_name(h) for h in typing.get_args(hint))
    if hint is type(None):
        return "None"
    if typing.get_origin(hint) is tuple:  # written as a YAML list
        return f"list[{type_name(typing.get_args(hint)[0])}]"
    return getattr(hint, "__name__", str(hint))


def rows(cls: type, values: dict[str, Any], prefix: str) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) of every field of `cls`, nested sections flattened."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out = []
    for field in dataclasses.fields(cls):
        hint = hints[field.name]
        value = values.get(field.name)
        if isinstance(hint, type) and issubclass(hint, Config):
            out += rows(hint, value or {}, f"{prefix}{field.name}.")
            continue
        out.append((f"{prefix}{field.name}", type_name(hint), _show(value), docs.get(field.name, "")))
    return out


def _show(value: Any) -> str:
    if isinstance(value, dict) and not value:
        return "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return "null" if value is None else str(value)


def describe(algo: str = "grpo", overrides: Sequence[str] = ()) -> str:
    """The listing printed by `trainer config --algo ALGO [key=value ...]`: the settings as a run with
    these overrides would resolve them."""
    user = user_settings(None, overrides)
    try:
        algorithm_cls = registry.get_algorithm(algo).config
    except registry.RegistryError as e:
        raise ConfigError(f"--algo {algo!r}: {e}") from None
    note = []
    try:
        values = settings_from_user(user, algo).resolved()
    except ConfigError as e:
        if user.get("algorithm"):  # the user's own algorithm settings are wrong: say so
            raise
        # the algorithm's defaults need one setting more to run (opd: algorithm.teacher); list them as
        # they are, the rest resolved as for the reference algorithm (their defaults do not depend on it)
        values = {**settings_from_user(user, "grpo").resolved(), "algo": algo, "algorithm": _defaults(algorithm_cls)}
        note = ["", f"To run, {algo} needs more than its defaults: {e}"]
    table = rows(RunSettings, {k: v for k, v in values.items() if k != "algorithm"}, "")
    table = [r for r in table if r[0] != "algorithm"]
    table += rows(algorithm_cls, values["algorithm"], "algorithm.")
    key_w = max(len(r[0]) for r in table)
    type_w = max(len(r[1]) for r in table)
    default_w = min(max(len(r[2]) for r in table), 24)
    lines = [
        f"Settings of `trainer train --algo {algo}` and `trainer compare` (set with key=value or in a --config YAML).",
        f"algorithm.* are the fields of {algorithm_cls.__name__}; `trainer config --algo NAME` shows another algorithm's.",
        "",
        f"{'key':{key_w}}  {'type':{type_w}}  {'default':{default_w}}  description",
    ]
    lines += [f"{k:{key_w}}  {t:{type_w}}  {d:{default_w}}  {doc}" for k, t, d, doc in table]
    return "\n".join(lines + note)


def _defaults(cls: type) -> dict[str, Any]:
    """A config class's field defaults as `to_dict` writes them, without validating them together."""
    out = {}
    for field in dataclasses.fields(cls):
        value = field.default if field.default is not dataclasses.MISSING else field.default_factory()
        out[field.name] = value.to_dict() if isinstance(value, Config) else value
    return out
