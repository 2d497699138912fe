"""Lazy public faces: a package lists the names it offers and the modules that define them.

A name's module is imported on first use (PEP 562 `__getattr__`), so importing a face stays
light (settings load without JAX programs or engines) and a face cannot close an import circle.
"""

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_face(package: str, modules: Mapping[str, Sequence[str]], subpackages: Sequence[str] = ()
              ) -> tuple[Callable[[str], Any], Callable[[], list[str]], dict[str, str]]:
    """`__getattr__` and `__dir__` for `package`, and its map of public name -> defining module;
    `subpackages` load on first use too (`rl_core.rollout` from `rl_core`)."""
    where = {name: module for module, names in modules.items() for name in names}
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name in subpackages:
            return importlib.import_module(f"{package}.{name}")
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        namespace[name] = value  # later look-ups skip __getattr__
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *where, *subpackages})

    return __getattr__, __dir__, where
