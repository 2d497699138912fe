#!/usr/bin/env python3
"""An offline install: a wheelhouse built from uv.lock for a target host, installed there without
a registry.

  # here (a machine with uv and a registry): the workspace's wheels and every locked dependency
  # for the target's Python and platform, less what the target already has
  python3 scripts/wheelhouse.py build --out wheelhouse --extra tpu --group dev \\
      --python 3.11 --platform manylinux_2_28_x86_64 --host-has jax jaxlib libtpu numpy scipy

  # there (no registry, no uv; Python and pip): into a folder on PYTHONPATH, next to the host's JAX
  python3 scripts/wheelhouse.py install wheelhouse --target ~/rl-site
  export PYTHONPATH=$PYTHONPATH:~/rl-site PATH=~/rl-site/bin:$PATH

  # a second wheelhouse beside it: a pinned requirements file kept out of the workspace (Tunix for
  # benchmarks/tunix_side_by_side.py), each wheel without its declared dependencies
  python3 scripts/wheelhouse.py extra benchmarks/tunix-requirements.txt --out tunix-wheelhouse  # [--index-has pandas]
  python3 scripts/wheelhouse.py install tunix-wheelhouse --target ~/tunix-site  # [--from-index URL]

`build` writes `wheelhouse/`: `ws/` (the workspace's own wheels), `wheels/` (the locked
dependencies, exact versions from `uv export --frozen`), `requirements.txt` (their pins) and
`manifest.json` (the lock's JAX version, the target, what was left to the host). `install` checks
the host first: a package left to the host (`--host-has`) must be importable there at the locked
version, or it refuses in one line naming the package and both versions (a JAX that differs from
the lock is not silently mixed with wheels built against it). `--from-index URL` names a wheel
index the host has (a `file://` one) for packages left out with `--index-has` (large wheels the
host's own index holds, to keep the wheelhouse small). Standard library and pip only: run it with a
Python that has pip (a uv venv has none: `python3 scripts/wheelhouse.py ...`).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def target_environment(python: str, platform: str) -> dict[str, str]:
    """PEP 508 marker values of a Linux target running CPython `python` on `platform`'s machine."""
    machine = "aarch64" if "aarch64" in platform else "x86_64"
    return {"python_version": python, "python_full_version": f"{python}.0", "sys_platform": "linux",
            "platform_system": "Linux", "platform_machine": machine, "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def applies(marker: str, environment: dict[str, str]) -> bool:
    """Whether a requirement line's marker holds on the target (pip's own marker parser)."""
    if not marker.strip():
        return True
    try:
        from packaging.markers import Marker  # noqa: PLC0415
    except ImportError:  # a bare Python: pip's own copy (pip is what fetches and installs the wheels)
        from pip._vendor.packaging.markers import Marker  # noqa: PLC0415

    return Marker(marker).evaluate(environment)


def locked_pins(extras: list[str], groups: list[str], environment: dict[str, str]) -> dict[str, str]:
    """name -> version of every locked third-party dependency of the workspace with these extras and
    groups on the target (the lock's resolution, not a new one: `uv export --frozen`; the lock holds
    one version per Python range, and the target's marker picks it)."""
    cmd = ["uv", "export", "--frozen", "--no-hashes", "--no-emit-workspace", "--no-default-groups", "--all-packages",
           "--format", "requirements-txt"]
    for extra in extras:
        cmd += ["--extra", extra]
    for group in groups:
        cmd += ["--group", group]
    text = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    pins = {}
    for line in text.splitlines():
        match = PIN.match(line.strip())
        if match and applies(line.partition(";")[2], environment):
            pins[canonical(match.group(1))] = match.group(3)
    return pins


def workspace_names() -> list[str]:
    """The workspace members' distribution names (packages/*, apps/*)."""
    names = []
    for project in sorted([*ROOT.glob("packages/*/pyproject.toml"), *ROOT.glob("apps/*/pyproject.toml")]):
        match = re.search(r'^name\s*=\s*"([^"]+)"', project.read_text(), re.MULTILINE)
        if match:
            names.append(match.group(1))
    return names


def download(pins: dict[str, str], folder: Path, python: str, platforms: list[str]) -> list[str]:
    """Wheels of `pins` for the target in `folder`; a pin published only as a source distribution
    (pure Python, e.g. cellpylib) is built into a wheel here. Returns the names built so."""
    tags = [x for p in platforms for x in ("--platform", p)]
    missing = re.compile(r"No matching distribution found for ([A-Za-z0-9._-]+)==")
    left, built = dict(pins), []
    while left:
        reqs = folder.parent / "download.txt"
        reqs.write_text("".join(f"{n}=={v}\n" for n, v in sorted(left.items())))
        result = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                                 "--python-version", python, "--implementation", "cp", *tags, "-d", str(folder),
                                 "-r", str(reqs)], capture_output=True, text=True)
        reqs.unlink()
        if result.returncode == 0:
            return built
        found = missing.search(result.stderr)
        if not found or canonical(found.group(1)) not in left:
            raise SystemExit(f"wheelhouse: pip download failed:\n{result.stderr[-2000:]}")
        name = canonical(found.group(1))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(folder),
                        f"{name}=={left.pop(name)}"], check=True)
        built.append(name)
    return built


def source_commit() -> str | None:
    """The checkout the workspace wheels are built from (`git describe --always --dirty`), or None outside
    git: `install` says it, so a wheelhouse older than the code beside it on a host shows."""
    if shutil.which("git") is None:
        return None
    result = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    return (result.stdout.strip() or None) if result.returncode == 0 else None


def build(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)
    pins = locked_pins(args.extra, args.group, target_environment(args.python, args.platform[0]))
    host = {canonical(n) for n in args.host_has}
    index = {canonical(n) for n in args.index_has}
    unknown = sorted((host | index) - set(pins))
    if unknown:
        print(f"wheelhouse: {', '.join(unknown)} not in the lock's dependencies for extras {args.extra} and groups "
              f"{args.group}; nothing to leave to the host", file=sys.stderr)
    left_out = {canonical(n) for n in args.leave_out}
    bring = {name: version for name, version in pins.items() if name not in host | index | left_out}
    (out / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(bring.items())))
    subprocess.run(["uv", "build", "--all-packages", "--wheel", "-o", str(out / "ws")], cwd=ROOT, check=True,
                   capture_output=True)
    built = download(bring, out / "wheels", args.python, args.platform)
    manifest = {
        "python": args.python, "platforms": args.platform, "extras": args.extra, "groups": args.group,
        "workspace": workspace_names(),
        "host_has": {n: pins[n] for n in sorted(host) if n in pins},
        "index_has": {n: pins[n] for n in sorted(index) if n in pins},
        "left_out": sorted(left_out & set(pins)),
        "jax": pins.get("jax"), "built_from_source": built, "commit": source_commit(),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wheelhouse: {len(bring)} locked wheels + {len(manifest['workspace'])} workspace wheels in {out} "
          f"({size / 2**20:.1f} MiB) for cp{args.python.replace('.', '')} {' '.join(args.platform)}; left to the "
          f"host: {', '.join(manifest['host_has']) or 'nothing'}")
    return 0


def read_pins(path: Path) -> dict[str, str]:
    """name -> version of a requirements file's `name==version` lines (comments and blanks skipped)."""
    pins = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        if not match:
            raise SystemExit(f"wheelhouse extra: {path}:{number}: {line!r} is not an exact pin (name==version)")
        pins[canonical(match.group(1))] = match.group(3)
    return pins


def build_extra(args: argparse.Namespace) -> int:
    """A wheelhouse of `args.requirements`' pins alone, for the same `install` (no workspace wheels)."""
    pins = read_pins(Path(args.requirements))
    locked = locked_pins(["tpu"], [], target_environment(args.python, args.platform[0]))
    clash = sorted(n for n in pins if n in locked)
    if clash:
        print(f"wheelhouse extra refused: {', '.join(clash)} pinned in {args.requirements} and locked by the workspace "
              f"({', '.join(f'{n}=={locked[n]}' for n in clash)}): take them from the workspace's wheelhouse, drop "
              "the lines", file=sys.stderr)
        return 2
    index = {canonical(n) for n in args.index_has}
    if unknown := sorted(index - set(pins)):
        print(f"wheelhouse extra refused: --index-has {', '.join(unknown)}: not pinned in {args.requirements}",
              file=sys.stderr)
        return 2
    bring = {n: v for n, v in pins.items() if n not in index}
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    (out / "wheels").mkdir(parents=True)
    (out / "ws").mkdir()
    (out / "requirements.txt").write_text("".join(f"{n}=={v}\n" for n, v in sorted(bring.items())))
    built = download(bring, out / "wheels", args.python, args.platform)
    manifest = {"python": args.python, "platforms": args.platform, "requirements": str(args.requirements),
                "workspace": [], "host_has": {}, "index_has": {n: pins[n] for n in sorted(index)}, "left_out": [],
                "jax": locked.get("jax"), "built_from_source": built}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wheelhouse: {len(bring)} pinned wheels of {args.requirements} in {out} ({size / 2**20:.1f} MiB) for "
          f"cp{args.python.replace('.', '')} {' '.join(args.platform)}; their other dependencies come from the "
          f"workspace's wheelhouse; from the host's index: {', '.join(manifest['index_has']) or 'nothing'}")
    return 0


def workspace_pins(house: Path) -> list[str]:
    """name==version of the workspace's own wheels: pinned, so that a same-named project on a host's
    index (PyPI has a `trainer`) is never taken instead."""
    return [f"{w.name.split('-')[0]}=={w.name.split('-')[1]}" for w in sorted((house / "ws").glob("*.whl"))]


def host_problem(manifest: dict) -> str | None:
    """Why this host cannot take the wheelhouse (None: it can): its Python, or a package left to it
    that is missing or not at the locked version."""
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if python != manifest["python"]:
        return f"the wheelhouse is for Python {manifest['python']}, this host runs {python}"
    for name, want in manifest["host_has"].items():
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return f"{name} {want} is left to this host by the wheelhouse, and this host has none: install it first"
        if have != want:
            return (f"this host has {name} {have}, the lock holds {want}: install {name}=={want} first, or build "
                    f"the wheelhouse without --host-has {name} to bring it")
    return None


def index_drift(locked: dict[str, str], target: Path) -> str | None:
    """What the host's index gave at other versions than the lock's, as installed in `target`
    (pip takes the index's newest where `--pin-index` is not given): one line, or None."""
    installed = {canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions(path=[str(target)])}
    other = [f"{n} {installed[n]} (locked {v})" for n, v in sorted(locked.items()) if n in installed and installed[n] != v]
    if not other:
        return None
    return (f"from the host's index at other versions than the lock's: {', '.join(other)}; "
            "--pin-index takes the locked ones, where the index has them")


def install(args: argparse.Namespace) -> int:
    house = Path(args.wheelhouse)
    manifest = json.loads((house / "manifest.json").read_text())
    problem = host_problem(manifest)
    if problem:
        print(f"wheelhouse install refused: {problem}", file=sys.stderr)
        return 2
    target = Path(args.target).expanduser()
    target.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    source = ["--index-url", args.from_index] if args.from_index else ["--no-index"]
    if manifest["index_has"] and not args.from_index:
        print(f"wheelhouse install refused: {', '.join(manifest['index_has'])} must come from the host's index "
              f"(--from-index URL)", file=sys.stderr)
        return 2
    pinned = [f"{n}=={v}" for n, v in manifest["index_has"].items()] if args.pin_index else list(manifest["index_has"])
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--quiet", "--no-deps", "--no-compile",
           "--upgrade", "--target", str(target), *source, "--find-links", str(house / "wheels"),
           "--find-links", str(house / "ws"), "-r", str(house / "requirements.txt"), *pinned, *workspace_pins(house)]
    result = subprocess.run(cmd, env=env)
    if result.returncode:
        return result.returncode
    drift = index_drift(manifest["index_has"], target)
    if drift:
        print(f"wheelhouse: {drift}")
    what = (f"{len(manifest['workspace'])} workspace packages (built from {manifest.get('commit') or 'an unknown commit'}) "
            "and their locked dependencies" if manifest["workspace"]
            else f"the pins of {manifest.get('requirements', 'the requirements')}")
    print(f"wheelhouse: installed {what} into {target}; add it to the end of PYTHONPATH (and {target / 'bin'} to PATH)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="the workspace's wheels and its locked dependencies for a target host")
    b.add_argument("--out", default="wheelhouse")
    b.add_argument("--python", default="3.11", help="the target's Python (major.minor)")
    b.add_argument("--platform", nargs="+", default=["manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                                                    "manylinux2014_x86_64"], help="pip platform tags the target takes")
    b.add_argument("--extra", action="append", default=[], help="a workspace extra (tpu, cuda12, gcs, ...)")
    b.add_argument("--group", action="append", default=[], help="a dependency group (dev for the tests)")
    b.add_argument("--host-has", nargs="*", default=[], help="locked packages the target already has (checked at install)")
    b.add_argument("--index-has", nargs="*", default=[], help="locked packages the target's own index holds")
    b.add_argument("--leave-out", nargs="*", default=[],
                   help="locked packages not to install at all (optional ones, to fit a size limit; their tests skip)")
    e = sub.add_parser("extra", help="a wheelhouse of a pinned requirements file alone (each wheel without its "
                                     "dependencies), installed beside the workspace's")
    e.add_argument("requirements", help="a file of name==version lines, none of them a package the lock holds")
    e.add_argument("--out", default="extra-wheelhouse")
    e.add_argument("--python", default="3.11", help="the target's Python (major.minor)")
    e.add_argument("--platform", nargs="+", default=["manylinux_2_28_x86_64", "manylinux_2_17_x86_64",
                                                    "manylinux2014_x86_64"], help="pip platform tags the target takes")
    e.add_argument("--index-has", nargs="*", default=[],
                   help="pinned packages the target's own index holds (installed from it: install --from-index)")
    i = sub.add_parser("install", help="install a wheelhouse on this host, without a registry")
    i.add_argument("wheelhouse")
    i.add_argument("--target", required=True, help="folder to install into (then on PYTHONPATH)")
    i.add_argument("--from-index", help="the host's own wheel index (file:// URL) for the --index-has packages")
    i.add_argument("--pin-index", action="store_true", help="take the --index-has packages at the locked versions")
    args = parser.parse_args(argv)
    return {"build": build, "extra": build_extra, "install": install}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
