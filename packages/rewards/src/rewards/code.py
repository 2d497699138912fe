"""User code named in settings: ``module:attribute`` or ``path/to/file.py:attribute``.

A user's reward function, or the function that builds a dataset's rows, lives in
their own file or module; a setting names it the way verl's
``custom_reward_function.path``/``name`` and Python entry points do. One loader reads every such
reference (rl_plugins.load_code: a file is imported under a private module name, once per
process); this module gives it the names the reward and task tables import.
"""

from __future__ import annotations

from rl_plugins import CodeError, is_code_reference
from rl_plugins import load_code as load_object

__all__ = ["CodeError", "is_code_reference", "load_object"]
