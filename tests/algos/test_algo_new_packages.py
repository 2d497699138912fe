"""RLOO, GSPO, CISPO, REINFORCE++, PPO, SAPO, DPPO and OPD: each a small package declared by its entry point alone.

Each package's code (no docstrings, comments or blank lines) stays within its
budget, its pyproject declares exactly the entry point and what it imports,
and nothing outside the package imports it for a side effect.
"""

import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

from code_lines import package_code_lines

REPO = Path(__file__).resolve().parents[2]
# name -> (most code lines, the distributions it depends on)
PACKAGES = {
    "rloo": (12, {"rl-core", "algo-grpo"}),
    "reinforce_pp": (17, {"rl-core", "algo-grpo", "jax>=0.7"}),
    "gspo": (40, {"rl-core", "algo-grpo", "jax>=0.7"}),
    "cispo": (40, {"rl-core", "algo-grpo", "jax>=0.7"}),
    "sapo": (40, {"rl-core", "algo-grpo", "jax>=0.7"}),
    "dppo": (40, {"rl-core", "algo-grpo", "jax>=0.7"}),
    # config defaults only: the teacher's pass and the per-token term are rl-core's (rl_core.math.distillation)
    "opd": (30, {"rl-core", "algo-grpo"}),
    # a second trained model, its loss, GAE's inputs, episodes' turn rewards, the critic's metrics, the
    # example's two fields more (its `example_spec`, for trainer plan): 137
    "ppo": (140, {"rl-core", "jax>=0.7", "numpy>=1.26"}),
}


def folder(name: str) -> Path:
    return REPO / "packages" / ("algo-" + name.replace("_", "-"))


@pytest.mark.parametrize("name", PACKAGES)
def test_package_is_small(name):
    counts = package_code_lines(folder(name))
    assert counts, f"no Python files in {folder(name)}"
    print(f"{name}: {sum(counts.values())} code lines {counts}")
    assert sum(counts.values()) <= PACKAGES[name][0], f"algo-{name} has {sum(counts.values())} code lines: {counts}"


@pytest.mark.parametrize("name", PACKAGES)
def test_entry_point_is_declared_and_installed(name):
    module = "algo_" + name
    pyproject = tomllib.loads((folder(name) / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == folder(name).name
    assert pyproject["project"]["entry-points"]["rl_core.algorithms"] == {name: f"{module}:ALGORITHM"}
    assert set(pyproject["project"]["dependencies"]) == PACKAGES[name][1]
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="rl_core.algorithms")}
    assert installed[name] == f"{module}:ALGORITHM"
    readme = (folder(name) / "README.md").read_text()
    assert "arXiv" in readme and "## Numbered changes from GRPO" in readme and "| paper |" in readme


@pytest.mark.parametrize("name", PACKAGES)
def test_nothing_imports_it_for_side_effects(name):
    module = "algo_" + name
    pattern = re.compile(rf"^\s*(import\s+{module}\b|from\s+{module}[\s.])", re.MULTILINE)
    offenders = [
        str(path.relative_to(REPO))
        for top in ("packages", "apps")
        for path in (REPO / top).rglob("*.py")
        if folder(name) not in path.parents and pattern.search(path.read_text(errors="replace"))
    ]
    assert offenders == []


@pytest.mark.parametrize("manifest", ["pyproject.toml", "apps/trainer/pyproject.toml"])
def test_the_workspace_and_the_trainer_depend_on_every_package(manifest):
    data = tomllib.loads((REPO / manifest).read_text())
    for name in PACKAGES:
        dist = folder(name).name
        assert dist in data["project"]["dependencies"]
        assert data["tool"]["uv"]["sources"][dist] == {"workspace": True}
