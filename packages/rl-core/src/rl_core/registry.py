"""Named functions, algorithms, environments and rollout engines, with discovery through entry points.

Configs name their choices (`advantage_estimator="grpo"`, `rollout.environment="calculator"`);
this registry turns names into objects. rl_core's own math registers itself when the registry
first loads the built-in modules (listed below, loaded explicitly, never by an
import side effect elsewhere). Algorithm packages declare an entry point in
the group `rl_core.algorithms` that points at an `Algorithm` value; environment packages
one in `rl_core.environments` that points at a factory (a class or a function taking the
environment's options as keywords and returning a fresh `rl_core.episodes.Environment`):

    [project.entry-points."rl_core.environments"]
    calculator = "trainer.environments:calculator"

Rollout engines (`rollout.engine`) one in `rl_core.engines` that points at an
`rl_core.rollout.engines.Engine` (rl_core's own `static` and `paged` are declared so too).

The registry loads entry points on a lookup miss (through rl_plugins, which lists every
group), so installing a package is all it takes. Direct construction without discovery always works too.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.metadata as metadata
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import rl_plugins as plugins
from rl_core.protocols import SignatureError, check_signature

ENTRY_POINT_GROUP = plugins.ALGORITHMS
FUNCTION_CATEGORIES = (
    "advantage_estimator", "token_advantage_estimator", "policy_loss", "loss_aggregation", "kl_estimator",
)
ALGORITHM = "algorithm"
ENVIRONMENT = "environment"
ENVIRONMENT_GROUP = plugins.ENVIRONMENTS
ENGINE = "engine"
ENGINE_GROUP = plugins.ENGINES
CATEGORIES = (*FUNCTION_CATEGORIES, ALGORITHM, ENVIRONMENT, ENGINE)

# rl_core modules whose decorators register the shared math.
_BUILTIN_MODULES = (
    "rl_core.math.advantages", "rl_core.math.returns", "rl_core.math.policy_losses", "rl_core.math.aggregation", "rl_core.math.kl",
)

T = TypeVar("T")


class RegistryError(LookupError):
    """A name that is unknown, registered twice, or whose provider failed to load."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Algorithm:
    """What an algorithm package exports (and points its entry point at)."""

    name: str
    """The name users select, e.g. "dr_grpo"."""
    config: type
    """The frozen config class (a subclass of `rl_core.config.AlgorithmConfig`)."""
    learner: type
    """The learner class (a subclass of `rl_core.learner.base.RLLearner`)."""
    functions: Mapping[str, Mapping[str, Callable[..., Any]]] = dataclasses.field(default_factory=dict)
    """Math this algorithm owns, by category then name (e.g. its advantage estimator)."""


def distribution_for(name: str) -> str:
    """The distribution that conventionally provides algorithm `name`."""
    return "algo-" + name.replace("_", "-")


@functools.cache
def _packages_distributions() -> Mapping[str, list[str]]:
    """Top-level module -> distributions; scanning every installed package once is enough."""
    return metadata.packages_distributions()


def _distribution_of(obj: Any) -> str:
    """The installed distribution whose top-level package defines `obj`."""
    top = (getattr(obj, "__module__", None) or type(obj).__module__ or "").split(".")[0]
    dists = _packages_distributions().get(top)
    if dists:
        return dists[0]
    # editable installs are missing from packages_distributions(); folder names map one to one
    try:
        return metadata.distribution(top.replace("_", "-")).name
    except metadata.PackageNotFoundError:
        return top or "unknown"


class Registry:
    """Names to objects by category; see the module docstring."""

    def __init__(
        self,
        *,
        group: str = ENTRY_POINT_GROUP,
        environment_group: str = ENVIRONMENT_GROUP,
        engine_group: str = ENGINE_GROUP,
        builtin_modules: Iterable[str] = _BUILTIN_MODULES,
    ) -> None:
        self._group = group
        self._environment_group = environment_group
        self._engine_group = engine_group
        self._builtin_modules = tuple(builtin_modules)
        self._entries: dict[str, dict[str, tuple[Any, str]]] = {c: {} for c in CATEGORIES}
        self._builtins_loaded = False
        self._entry_points_loaded = False
        self._load_failures: dict[str, str] = {}  # entry point name -> why it failed
        self._conflicts: dict[str, str] = {}  # algorithm name -> the duplicate registration error
        self._foreign: dict[str, dict[str, str]] = {c: {} for c in CATEGORIES}  # name -> what it means here

    # -- registration -----------------------------------------------------------------

    def register(self, category: str, name: str, obj: T, *, provider: str | None = None) -> T:
        """Register `obj` under `name`; the same object twice is a no-op.

        A function must accept its category's call (rl_core.protocols), else `SignatureError`.
        """
        if category not in CATEGORIES:
            raise RegistryError(f"unknown category {category!r}; categories are {', '.join(CATEGORIES)}")
        if category == ENVIRONMENT and not callable(obj):
            raise TypeError(f"environment {name!r}: the factory {obj!r} is not callable")
        if category == ENGINE and not callable(getattr(obj, "build", None)):
            raise TypeError(f"engine {name!r}: {obj!r} is not an rl_core.rollout.engines.Engine (no build)")
        check_signature(category, name, obj)
        provider = provider or _distribution_of(obj)
        known = self._entries[category].get(name)
        if known is not None and known[0] is not obj:
            raise RegistryError(
                f"{category} {name!r} is registered twice: by {known[1]} ({known[0]!r}) "
                f"and by {provider} ({obj!r}); rename one of them"
            )
        self._entries[category][name] = (obj, provider)
        return obj

    def note_foreign_name(self, category: str, name: str, meaning: str) -> None:
        """Another library's name for something known here under another name.

        A lookup of `name` then fails with `meaning` (which states the name to use)
        instead of a spelling suggestion, which could point at a different meaning.
        """
        self._foreign[category][name] = meaning

    def register_algorithm(self, algorithm: Algorithm, *, provider: str | None = None) -> Algorithm:
        """Register an algorithm and the functions it owns."""
        provider = provider or _distribution_of(algorithm.config)
        for category, functions in algorithm.functions.items():
            if category not in FUNCTION_CATEGORIES:
                raise RegistryError(
                    f"algorithm {algorithm.name!r} declares functions in unknown category {category!r}; "
                    f"categories are {', '.join(FUNCTION_CATEGORIES)}"
                )
            for fn_name, fn in functions.items():
                check_signature(category, fn_name, fn)  # all checked before any is registered
        for category, functions in algorithm.functions.items():
            for fn_name, fn in functions.items():
                self.register(category, fn_name, fn, provider=provider)
        return self.register(ALGORITHM, algorithm.name, algorithm, provider=provider)

    # -- lookup -----------------------------------------------------------------------

    def get(self, category: str, name: str) -> Any:
        """The object registered as `name`, loading providers on a miss."""
        if category not in CATEGORIES:
            raise RegistryError(f"unknown category {category!r}; categories are {', '.join(CATEGORIES)}")
        self._load_builtins()
        if name not in self._entries[category]:
            self.load_entry_points()
        if category == ALGORITHM and name in self._conflicts:
            raise RegistryError(self._conflicts[name])
        if name not in self._entries[category]:
            raise RegistryError(self._unknown_message(category, name))
        return self._entries[category][name][0]

    def get_algorithm(self, name: str) -> Algorithm:
        return self.get(ALGORITHM, name)

    def names(self, category: str) -> list[str]:
        """Every name known in `category`, after loading all providers."""
        self._load_builtins()
        self.load_entry_points()
        return sorted(self._entries[category])

    def provider(self, category: str, name: str) -> str:
        self.get(category, name)
        return self._entries[category][name][1]

    @property
    def load_failures(self) -> Mapping[str, str]:
        """Entry points that failed to load, by name, with the reason."""
        return dict(self._load_failures)

    def load_entry_points(self) -> None:
        """Load every algorithm, environment and engine entry point once; failures are kept, not hidden."""
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        self._load_builtins()
        for plugin in plugins.entry_points(self._group):
            try:
                value = plugin.load()
            except plugins.PluginError as e:  # a broken plugin must not hide the others
                self._load_failures[plugin.name] = str(e)
                continue
            if not isinstance(value, Algorithm):
                self._load_failures[plugin.name] = (
                    f"entry point {plugin.name!r} of distribution {plugin.distribution!r} points at {plugin.target!r}, "
                    f"which is a {type(value).__name__}, not an rl_core.registry.Algorithm"
                )
                continue
            try:
                self.register_algorithm(value, provider=plugin.distribution)
            except SignatureError as e:
                self._load_failures[plugin.name] = f"entry point {plugin.name!r} of distribution {plugin.distribution!r}: {e}"
            except RegistryError as e:
                # keep loading the others; the clashing name stays an error on every lookup
                self._conflicts[value.name] = str(e)
        for category, group in ((ENVIRONMENT, self._environment_group), (ENGINE, self._engine_group)):
            for plugin in plugins.entry_points(group):
                try:
                    self.register(category, plugin.name, plugin.load(), provider=plugin.distribution)
                except plugins.PluginError as e:  # one broken plugin must not hide the others
                    self._load_failures[plugin.name] = str(e)
                except Exception as e:  # noqa: BLE001 - loaded, but not an environment or an engine
                    self._load_failures[plugin.name] = (f"entry point {plugin.name!r} of distribution "
                                                        f"{plugin.distribution!r} ({plugin.target}): {type(e).__name__}: {e}")

    def _load_builtins(self) -> None:
        if self._builtins_loaded:
            return
        self._builtins_loaded = True
        for module in self._builtin_modules:
            importlib.import_module(module)

    def _unknown_message(self, category: str, name: str) -> str:
        entries = self._entries[category]
        by_provider: dict[str, list[str]] = {}
        for known, (_, provider) in sorted(entries.items()):
            by_provider.setdefault(provider, []).append(known)
        known_text = "; ".join(f"{', '.join(names)} (from {p})" for p, names in sorted(by_provider.items()))
        lines = [f"unknown {category} {name!r}. Known: {known_text or 'none'}."]
        close = difflib.get_close_matches(name, list(entries), n=1)
        if name in self._foreign[category]:
            lines.append(self._foreign[category][name])
        elif close:
            lines.append(f"Did you mean {close[0]!r}?")
        if name in self._load_failures:
            lines.append(f"It is installed but failed to load: {self._load_failures[name]}")
        elif category == ALGORITHM:
            lines.append(
                f"If {name!r} is an algorithm package, install its distribution: "
                f"`uv pip install {distribution_for(name)}` (or add {distribution_for(name)!r} to your dependencies)."
            )
        elif category == ENVIRONMENT:
            lines.append(f"Install a package that declares it in the entry-point group {self._environment_group!r}.")
        elif category == ENGINE:
            lines.append(f"Install a package that declares it in the entry-point group {self._engine_group!r}.")
        other_failures = [why for ep, why in self._load_failures.items() if ep != name]
        if other_failures:
            lines.append("Entry points that failed to load: " + " | ".join(other_failures))
        return " ".join(lines)


registry = Registry()
"""The process-wide registry."""


def register(category: str, name: str) -> Callable[[T], T]:
    """Decorator: `@register("advantage_estimator", "grpo")`."""

    def decorate(obj: T) -> T:
        return registry.register(category, name, obj)

    return decorate


def get(category: str, name: str) -> Any:
    return registry.get(category, name)


def get_algorithm(name: str) -> Algorithm:
    return registry.get_algorithm(name)


def register_environment(name: str, factory: T) -> T:
    """Register an environment factory as `name`; the same factory twice is a no-op, another one an error."""
    return registry.register(ENVIRONMENT, name, factory)


def get_environment(name: str) -> Callable[..., Any]:
    """The environment factory registered as `name`; an unknown name says what exists and how to add one."""
    return registry.get(ENVIRONMENT, name)


def environment_names() -> list[str]:
    """Every registered environment name (entry points loaded)."""
    return registry.names(ENVIRONMENT)


def get_engine(name: str) -> Any:
    """The rollout engine registered as `name` (an rl_core.rollout.engines.Engine)."""
    return registry.get(ENGINE, name)


def engine_names() -> list[str]:
    """Every registered rollout engine name (entry points loaded)."""
    return registry.names(ENGINE)


def environment_factory(name: str, options: dict) -> Callable[[], Any]:
    """A no-argument factory of fresh environments `name` with `options`."""
    factory = get_environment(name)
    return lambda: factory(**options)
