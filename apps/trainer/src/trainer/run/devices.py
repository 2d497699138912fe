"""The line a run starts with: which JAX backend and devices it runs on.

A CPU-only install on a GPU machine (no `--extra cuda12`) trains, slowly, on the host; this line
says so before the first step instead of leaving it to be guessed from the speed.
"""

from __future__ import annotations

from collections import Counter

import jax


def describe() -> str:
    """E.g. "JAX 0.10.2 on gpu: 8 devices (8 x NVIDIA H100 80GB HBM3)"; a multi-process run adds its
    process count."""
    devices = jax.devices()
    kinds = ", ".join(f"{n} x {kind}" for kind, n in Counter(d.device_kind for d in devices).items())
    processes = f" over {jax.process_count()} processes" if jax.process_count() > 1 else ""
    count = f"{len(devices)} device{'s' if len(devices) != 1 else ''}"
    return f"JAX {jax.__version__} on {jax.default_backend()}: {count} ({kinds}){processes}"
