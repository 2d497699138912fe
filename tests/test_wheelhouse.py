"""scripts/wheelhouse.py: the offline install. The fast tests check what it decides (the target's
locked pins, the host check); the e2e test builds a real wheelhouse from uv.lock (it downloads
from the registry) and installs it with pip, without a registry, into a folder."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import shutil

import pytest

from host import need_uv

def pip_python() -> str | None:
    """A python3 with pip on PATH outside this venv (which uv makes without pip): what the script runs on."""
    path = os.pathsep.join(d for d in os.environ.get("PATH", "").split(os.pathsep) if not d.startswith(sys.prefix))
    found = shutil.which("python3", path=path)
    if found and subprocess.run([found, "-m", "pip", "--version"], capture_output=True).returncode == 0:
        return found
    return None

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("wheelhouse", ROOT / "scripts" / "wheelhouse.py")
wheelhouse = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wheelhouse)

def venv_site() -> Path:
    """This venv's site-packages (its JAX stands for the host's)."""
    import jax

    return Path(jax.__file__).parent.parent


TARGET = wheelhouse.target_environment("3.11", "manylinux_2_28_x86_64")


def test_markers_are_the_targets():
    """The lock holds one version per Python range; the target's marker picks one."""
    assert wheelhouse.applies(" python_full_version < '3.12'", TARGET)
    assert not wheelhouse.applies(" python_full_version >= '3.12'", TARGET)
    assert not wheelhouse.applies(" sys_platform == 'darwin'", TARGET)
    assert wheelhouse.applies(" platform_machine == 'x86_64' and sys_platform == 'linux'", TARGET)
    assert wheelhouse.applies("", TARGET)


def test_locked_pins_are_the_locks_for_the_target():
    need_uv()
    pins = wheelhouse.locked_pins(["tpu"], [], TARGET)
    lock = (ROOT / "uv.lock").read_text()
    assert f'name = "jax"\nversion = "{pins["jax"]}"' in lock
    assert "libtpu" in pins  # the tpu extra's
    assert "pytest" not in pins and "rl-core" not in pins  # no dev group asked; the workspace is built, not pinned


def _manifest(tmp_path: Path, **host_has: str) -> dict:
    return {"python": f"{sys.version_info.major}.{sys.version_info.minor}", "host_has": host_has}


def test_host_with_the_locked_version_is_taken(tmp_path):
    import jax

    assert wheelhouse.host_problem(_manifest(tmp_path, jax=jax.__version__)) is None


def test_host_with_another_version_is_refused_in_one_line(tmp_path):
    import jax

    problem = wheelhouse.host_problem(_manifest(tmp_path, jax="0.0.1"))
    assert problem == (f"this host has jax {jax.__version__}, the lock holds 0.0.1: install jax==0.0.1 first, or build "
                       "the wheelhouse without --host-has jax to bring it")
    missing = wheelhouse.host_problem(_manifest(tmp_path, **{"no-such-package": "1.0"}))
    assert missing.startswith("no-such-package 1.0 is left to this host")
    other_python = wheelhouse.host_problem({"python": "2.7", "host_has": {}})
    assert other_python.startswith("the wheelhouse is for Python 2.7")


def test_install_refuses_before_touching_the_target(tmp_path):
    house = tmp_path / "house"
    house.mkdir()
    (house / "manifest.json").write_text(json.dumps(_manifest(tmp_path, jax="0.0.1") | {"index_has": {}}))
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "wheelhouse.py"), "install", str(house),
                             "--target", str(tmp_path / "site")], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().startswith("wheelhouse install refused: this host has jax")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "site").exists()


@pytest.mark.e2e
def test_build_then_install_without_a_registry(tmp_path):
    """The wheelhouse for this host's Python (less JAX and what it brings, left to the host as on a
    TPU host), installed by pip with no index into a folder: the workspace imports from there."""
    need_uv()
    python = pip_python()
    if python is None:
        pytest.skip("no python3 with pip on PATH")
    house, site = tmp_path / "house", tmp_path / "site"
    host = ["jax", "jaxlib", "numpy", "scipy", "ml-dtypes", "opt-einsum"]
    script = str(ROOT / "scripts" / "wheelhouse.py")
    built = subprocess.run([python, script, "build", "--python", f"{sys.version_info.major}.{sys.version_info.minor}", "--out", str(house), "--host-has", *host],
                           capture_output=True, text=True, cwd=ROOT)
    assert built.returncode == 0, built.stderr[-2000:]
    manifest = json.loads((house / "manifest.json").read_text())
    assert set(manifest["host_has"]) == set(host) and manifest["jax"] == manifest["host_has"]["jax"]
    assert len(list((house / "ws").glob("*.whl"))) == len(manifest["workspace"]) == 16
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert len(manifest["commit"]) >= 7 and head.startswith(manifest["commit"].removesuffix("-dirty"))
    # the host check reads this venv's JAX (the "host's"), then pip installs the rest into `site`
    installed = subprocess.run([python, script, "install", str(house), "--target", str(site)],
                               capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(venv_site())})
    assert installed.returncode == 0, installed.stderr[-2000:]
    assert f"workspace packages (built from {manifest['commit']})" in installed.stdout
    probe = "import rl_core, trainer, algo_grpo, flax; print(rl_core.__file__)"
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    # this venv's JAX is the host's; the workspace and the rest come from the installed folder
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(site))


def test_extra_reads_exact_pins_and_refuses_anything_else(tmp_path):
    """`extra`'s requirements file: name==version lines (comments and blanks skipped), names canonical."""
    good = tmp_path / "good.txt"
    good.write_text("# Tunix\ngoogle-tunix==0.1.7  # the learner\n\nWadler_Lindig==0.1.8\n")
    assert wheelhouse.read_pins(good) == {"google-tunix": "0.1.7", "wadler-lindig": "0.1.8"}
    loose = tmp_path / "loose.txt"
    loose.write_text("pandas>=3\n")
    with pytest.raises(SystemExit, match=r"loose.txt:1: 'pandas>=3' is not an exact pin"):
        wheelhouse.read_pins(loose)


def test_extra_refuses_a_package_the_lock_holds(tmp_path, capsys):
    """A pin of a locked package would install a second version beside the workspace's: refused before
    anything is downloaded, naming the locked version."""
    need_uv()
    reqs = tmp_path / "reqs.txt"
    reqs.write_text("google-tunix==0.1.7\nflax==0.11.1\n")
    assert wheelhouse.main(["extra", str(reqs), "--out", str(tmp_path / "house")]) == 2
    err = capsys.readouterr().err
    assert "wheelhouse extra refused: flax pinned in" in err and "flax==0.12.8" in err
    assert not (tmp_path / "house").exists()


def test_extra_leaves_what_the_hosts_index_has_to_it(tmp_path, capsys):
    """`extra --index-has`: those pins are not downloaded (a wheelhouse under a size limit), the manifest
    says so, and `install` then needs the host's index; a name the file does not pin is refused."""
    need_uv()
    reqs = tmp_path / "reqs.txt"
    reqs.write_text("pandas==3.1.1\n")
    assert wheelhouse.main(["extra", str(reqs), "--out", str(tmp_path / "bad"), "--index-has", "numpyy"]) == 2
    assert "--index-has numpyy: not pinned in" in capsys.readouterr().err and not (tmp_path / "bad").exists()
    house = tmp_path / "house"
    assert wheelhouse.main(["extra", str(reqs), "--out", str(house), "--index-has", "Pandas"]) == 0
    manifest = json.loads((house / "manifest.json").read_text())
    assert manifest["index_has"] == {"pandas": "3.1.1"} and not list((house / "wheels").iterdir())
    assert (house / "requirements.txt").read_text() == ""
    assert wheelhouse.main(["install", str(house), "--target", str(tmp_path / "site")]) == 2
    assert "pandas must come from the host's index (--from-index URL)" in capsys.readouterr().err


def test_tunix_requirements_hold_no_locked_package():
    """benchmarks/tunix-requirements.txt brings only what the workspace's lock lacks."""
    need_uv()
    pins = wheelhouse.read_pins(ROOT / "benchmarks" / "tunix-requirements.txt")
    assert "google-tunix" in pins
    assert not set(pins) & set(wheelhouse.locked_pins(["tpu"], [], TARGET))


def test_install_says_which_packages_the_hosts_index_gave_at_other_versions(tmp_path):
    """A TPU host's index had tensorstore 0.1.85 where the lock holds 0.1.86 (2026-12-07), and a test
    then failed on 0.1.85's messages: the install names such a package in one line."""
    for name, version in (("tensorstore", "0.1.85"), ("Pillow", "12.0.0")):
        info = tmp_path / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    locked = {"tensorstore": "0.1.86", "pillow": "12.0.0", "pyarrow": "22.0.0"}
    assert wheelhouse.index_drift(locked, tmp_path) == (
        "from the host's index at other versions than the lock's: tensorstore 0.1.85 (locked 0.1.86); "
        "--pin-index takes the locked ones, where the index has them")
    assert wheelhouse.index_drift({"pillow": "12.0.0"}, tmp_path) is None
