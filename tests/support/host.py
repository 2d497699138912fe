"""What a test needs of the host it runs on, said once: a test that needs what this host lacks is
skipped with the reason, not failed.

A development machine and CI have everything. An accelerator host may not: the TPU host the
suite is run on (scripts/tpu-tests.sh, docs/development.md) has no `uv`, no sockets at all (not
even loopback), and a TPU backend, so a test about XLA:CPU has nothing to look at there. Each
probe runs once per process.

    need_sockets()           inside a test or fixture that opens a socket (servers, clients)
    need_uv()                inside a test that runs `uv`
    @about_the_cpu("why")    on a test (or `pytestmark`) that is about the CPU backend itself
"""

from __future__ import annotations

import functools
import shutil
import socket

import pytest


@functools.cache
def sockets_missing() -> str | None:
    """Why this host cannot open a loopback socket (None: it can)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind(("127.0.0.1", 0))
            probe.listen(1)
    except OSError as e:
        return f"{type(e).__name__}: {e}"
    return None


def need_sockets() -> None:
    """Skip the calling test when this host cannot open a loopback socket."""
    if why := sockets_missing():
        pytest.skip(f"needs sockets (a loopback server), which this host refuses: {why}")


@functools.cache
def uv_missing() -> bool:
    return shutil.which("uv") is None


def need_uv() -> None:
    """Skip the calling test when `uv` is not on PATH (a host installed from wheels)."""
    if uv_missing():
        pytest.skip("needs uv, which is not on PATH here (a host installed from wheels)")


@functools.cache
def backend() -> str:
    """JAX's default backend ("cpu", "tpu", "gpu"). Asked when a test runs, never at import:
    the multidevice tier sets the CPU device count before JAX starts its backend."""
    import jax  # noqa: PLC0415 (see above)

    return jax.default_backend()


def about_the_cpu(why: str) -> pytest.MarkDecorator:
    """Marks a test about XLA:CPU itself (its compiled HLO, its thread pools, its simulated
    devices, timings of its runtime): skipped on any other backend, saying `why`."""
    return pytest.mark.about_the_cpu(why)


def skip_unless_cpu(item: pytest.Item) -> None:
    """tests/conftest.py's setup hook: the `about_the_cpu` marker's skip, decided when the test
    runs (the backend is known then)."""
    marker = item.get_closest_marker("about_the_cpu")
    if marker is not None and backend() != "cpu":
        pytest.skip(f"about XLA:CPU, and this backend is {backend()}: {marker.args[0]}")
