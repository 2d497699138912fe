"""What the trainer keeps for later runs in the user's cache folder ($XDG_CACHE_HOME, else ~/.cache):
`rl-variants/models` (local copies of models read from a URL) and `rl-variants/jax` (XLA's
compiled programs).

The compiled programs are JAX's persistent compilation cache (`rl_core.runtime.use_persistent_cache`).
JAX names each entry by a hash of everything the executable depends on: the program's StableHLO (as
this jax lowered it), the jaxlib version (each jax requires its own jaxlib release), the backend's
platform and version (on a TPU, the libtpu build), the devices' topology, the compile options and
the XLA flags (XLA_FLAGS, LIBTPU_INIT_ARGS). So an upgrade, another chip or another flag reads
other entries instead of a stale one, and nothing here has to invalidate anything; entries are
evicted, least recently used first, beyond the cache's size limit.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import jax
from rl_core.runtime import use_persistent_cache


def user_cache_dir(name: str, environ: Mapping[str, str] | None = None) -> Path:
    """rl-variants/`name` in the user's cache folder."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rl-variants" / name


def use_compilation_cache(environ: Mapping[str, str] | None = None,
                          warn: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> Path | None:
    """Keep compiled programs in `user_cache_dir("jax")`; the folder used, or None when it is off.

    JAX_ENABLE_COMPILATION_CACHE=false (JAX's own switch) turns it off. A JAX_COMPILATION_CACHE_DIR
    in the environment is the user's own JAX setup (JAX reads it, with its other JAX_* settings) and
    is left as it is. A cache folder that cannot be made (a read-only home) costs compile time,
    not the run: one line says so and the run goes on without it.
    """
    environ = os.environ if environ is None else environ
    if not jax.config.jax_enable_compilation_cache:
        return None
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return Path(environ["JAX_COMPILATION_CACHE_DIR"])
    folder = user_cache_dir("jax", environ)
    try:
        use_persistent_cache(folder)
    except OSError as e:
        warn(f"compilation cache off: cannot make {folder} ({e.strerror}); set XDG_CACHE_HOME or "
             "JAX_COMPILATION_CACHE_DIR to a writable folder to keep compiled programs between runs")
        return None
    return folder
