"""User code named in settings: ``module:attribute`` or ``path/to/file.py:attribute``.

A user's reward function, or the function that builds a dataset's rows, lives in
their own file or module; a setting names it the way verl's
``custom_reward_function.path``/``name`` and Python entry points do. A file is
imported under a private module name (its folder is not put on ``sys.path``), once
per process; a module is imported as ``importlib`` would.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

__all__ = ["CodeError", "is_code_reference", "load_object"]


class CodeError(ValueError):
    """A code reference that does not name a loadable object."""


def is_code_reference(text: object) -> bool:
    """True for ``module:attribute`` or ``file.py:attribute`` (a registered name has no colon)."""
    if not isinstance(text, str) or text.count(":") != 1:
        return False
    where, attribute = text.split(":")
    return bool(where) and attribute.isidentifier()


def load_object(reference: str, what: str = "object") -> Any:
    """The object that `reference` names; a bad reference raises CodeError saying which part failed."""
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
        raise CodeError(f"{what} {reference!r}: {where} defines no {attribute!r} (its callables: {', '.join(names) or 'none'})")
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
