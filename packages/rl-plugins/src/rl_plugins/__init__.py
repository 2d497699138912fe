"""Plugins and user code: the entry-point groups every table of names reads, one loader for
them, and one loader of the code a setting names (``module:function`` or ``file.py:function``).

An installed package adds a name by declaring an entry point that points at a value, in one of
`GROUPS`; the table that owns the group (rl_core.registry for algorithms, environments and
engines; rewards.registry; trainer.tasks.registry; rl_core.episodes.agents) loads it with
`entry_points` or `one_per_name`, so a broken plugin is the same one line everywhere: its name,
its distribution, what it points at and why it failed. Importing this module is light (no JAX):
the reward and task tables read it before anything else loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

ALGORITHMS = "rl_core.algorithms"
ENVIRONMENTS = "rl_core.environments"
ENGINES = "rl_core.engines"
AGENT_RUNTIMES = "rl_core.agent_runtimes"
REWARD_FUNCTIONS = "rewards.functions"
TASKS = "trainer.tasks"
GROUPS: Mapping[str, str] = {
    ALGORITHMS: "algorithms: an rl_core.registry.Algorithm",
    ENVIRONMENTS: "environments: a factory of rl_core.episodes.Environment",
    ENGINES: "rollout engines: an rl_core.rollout.engines.Engine",
    AGENT_RUNTIMES: "what runs agents against a served policy (the trainer's `openai`)",
    REWARD_FUNCTIONS: "reward functions: a factory taking the reward's options",
    TASKS: "tasks: a factory taking the task's options, returning a trainer.tasks.Task",
}
"""Every entry-point group, with what its entry points point at."""


class PluginError(ValueError):
    """An entry point that fails to load, or one name that two distributions declare."""


class CodeError(ValueError):
    """A code reference that does not name a loadable object."""


@dataclasses.dataclass(frozen=True)
class Plugin:
    """One entry point of a group, not loaded yet."""

    name: str
    distribution: str
    """The distribution that declares it ("an unknown distribution" when the path hides it)."""
    target: str
    """What it points at, ``module:attribute``."""
    entry_point: metadata.EntryPoint

    def load(self) -> Any:
        """The value it points at; any failure (an import, a missing name) is a one-line PluginError."""
        try:
            return self.entry_point.load()
        except Exception as e:  # noqa: BLE001 - a broken plugin is named, not a traceback
            raise PluginError(f"entry point {self.name!r} of distribution {self.distribution!r} ({self.target}) "
                              f"failed to load: {type(e).__name__}: {e}") from e


def entry_points(group: str) -> list[Plugin]:
    """The entry points of `group` (one of `GROUPS`, or a test's own), in the order the path lists
    them (one name may come twice)."""
    return [Plugin(ep.name, ep.dist.name if ep.dist is not None else "an unknown distribution", ep.value, ep)
            for ep in metadata.entry_points(group=group)]


def one_per_name(group: str, what: str) -> dict[str, Plugin]:
    """The entry points of `group` by name; a name that two distributions declare is a PluginError
    naming both (`what` names the kind, e.g. "task"); one distribution seen twice on the path is one."""
    found: dict[str, Plugin] = {}
    for plugin in entry_points(group):
        known = found.get(plugin.name)
        if known is not None and known.distribution != plugin.distribution:
            raise PluginError(f"{what} {plugin.name!r} is registered by two distributions, {known.distribution!r} "
                              f"and {plugin.distribution!r}; uninstall one or rename its entry point")
        found[plugin.name] = plugin
    return found


# -- user code: module:attribute or path/to/file.py:attribute --------------------------------------


def is_code_reference(text: object) -> bool:
    """True for ``module:attribute`` or ``file.py:attribute`` (a registered name has no colon)."""
    if not isinstance(text, str) or text.count(":") != 1:
        return False
    where, attribute = text.split(":")
    return bool(where) and attribute.isidentifier()


def load_code(reference: str, what: str = "object") -> Any:
    """The object that `reference` names; a bad reference is a one-line CodeError saying which part
    failed. A file is imported under a private module name (its folder is not put on ``sys.path``),
    once per process; a module is imported as ``importlib`` would."""
    if not is_code_reference(reference):
        raise CodeError(f"{what} {reference!r}: expected 'module:function' or 'path/to/file.py:function'")
    where, attribute = reference.split(":")
    if where.endswith(".py"):
        module = _file_module(where, what, reference)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise CodeError(f"{what} {reference!r}: module {where!r} cannot be imported ({e})") from None
    if not hasattr(module, attribute):
        names = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise CodeError(f"{what} {reference!r}: {where} defines no {attribute!r} "
                        f"(its callables: {', '.join(names) or 'none'})")
    return getattr(module, attribute)


def _file_module(where: str, what: str, reference: str) -> Any:
    path = Path(where).expanduser().resolve()
    if not path.is_file():
        raise CodeError(f"{what} {reference!r}: file {where!r} does not exist")
    name = "_user_code_" + hashlib.sha1(str(path).encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before running it: dataclasses and pickling look the module up
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - the user's file failed at import: say where
        del sys.modules[name]
        raise CodeError(f"{what} {reference!r}: importing {where} raised {type(e).__name__}: {e}") from None
    return module


__all__ = ["AGENT_RUNTIMES", "ALGORITHMS", "ENGINES", "ENVIRONMENTS", "GROUPS", "REWARD_FUNCTIONS", "TASKS",
           "CodeError", "Plugin", "PluginError", "entry_points", "is_code_reference", "load_code", "one_per_name"]
