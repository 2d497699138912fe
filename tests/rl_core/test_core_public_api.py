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


def test_every_wing_face_name_resolves():
    for wing in SUBPACKAGES + ("episodes",):
        face = importlib.import_module(f"rl_core.{wing}")
        lazy = getattr(face, "_LAZY", {})
        for name, module in lazy.items():
            assert getattr(face, name) is getattr(importlib.import_module(module), name), (wing, name)
        assert set(lazy) <= set(dir(face)) and set(lazy) <= set(face.__all__)


def test_apps_and_algorithms_import_through_the_faces():
    """Outside rl_core, code imports `rl_core` or `rl_core.<wing>`, never a wing's module."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = [*root.glob("apps/*/src/**/*.py"), *root.glob("packages/algo-*/src/**/*.py"),
             *root.glob("benchmarks/*.py")]
    assert len(files) > 50
    deep = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rl_core."):
                parts = node.module.split(".")
                if len(parts) > 2 or (len(parts) == 2 and parts[1] not in (*SUBPACKAGES, "episodes")):
                    deep.append(f"{path.relative_to(root)}:{node.lineno} {node.module}")
    assert not deep, "import these through rl_core or rl_core.<wing>:\n" + "\n".join(deep)
