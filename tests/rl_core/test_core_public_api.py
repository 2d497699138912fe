"""rl_core's public API: every name in `__all__` resolves to its defining module, and importing
rl_core (or its sub-packages) loads no JAX, so the trainer can read its config before the join."""

import importlib
import subprocess
import sys

import rl_core

SUBPACKAGES = ("math", "policy", "train", "rollout", "learner", "run", "runtime")


def test_every_public_name_resolves():
    for name in rl_core.__all__:
        value = getattr(rl_core, name)
        assert value is getattr(importlib.import_module(rl_core._EXPORTS[name]), name)
    assert set(rl_core.__all__) <= set(dir(rl_core))


def test_unknown_name_raises_attribute_error():
    try:
        rl_core.no_such_name
    except AttributeError:
        pass
    else:
        raise AssertionError("expected AttributeError")


def test_import_is_light():
    code = ("import sys, rl_core, rl_core.config, rl_core.registry, rl_core.data, "
            + ", ".join(f"rl_core.{p}" for p in SUBPACKAGES) + "; print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
