"""The persistent compilation cache: a second process loads what the first compiled.

Each process gets a fresh cache folder through `use_persistent_cache`, so the
suite's own cache (set in conftest) is not touched.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from rl_core.runtime.compiles import CACHE_MIN_COMPILE_SECS

SCRIPT = """
import json, sys
import jax, jax.numpy as jnp
from jax import monitoring
from rl_core.runtime.compiles import compile_count, use_persistent_cache
use_persistent_cache(sys.argv[1], min_compile_secs=0)  # these two programs compile in milliseconds
hits = []
monitoring.register_event_listener(lambda event, **_: hits.append(event) if event.endswith("cache_hits") else None)
start = compile_count()
jax.jit(lambda x: jnp.tanh(x) * 3.0 + x.sum())(jnp.arange(8.0)).block_until_ready()
print(json.dumps({"programs": compile_count() - start, "loaded": len(hits)}))
"""


def run(cache: Path, env: dict) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(cache)], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_the_program_and_every_entry_keeps_its_access_time(tmp_path):
    # without the suite's cache settings; JAX_PLATFORMS kept (on a TPU host: the CPU, this process holds the chip)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_") or k == "JAX_PLATFORMS"}
    cache = tmp_path / "cache"
    first, second = run(cache, env), run(cache, env)
    # jnp.arange and the jitted function: compiled by the first process, loaded by the second,
    # which still counts them, so "no new programs after step 1" keeps its meaning with a warm cache
    assert first == {"programs": 2, "loaded": 0} and second == {"programs": 2, "loaded": 2}
    entries = [p for p in cache.iterdir() if p.name.endswith("-cache")]
    assert entries and all(p.with_name(p.name.removesuffix("-cache") + "-atime").exists() for p in entries)


def test_settings_reach_child_processes_through_the_environment():
    # conftest called use_persistent_cache: a child that imports jax reads the same settings
    assert os.environ["JAX_COMPILATION_CACHE_DIR"].endswith("jax-compilation-cache")
    assert float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]) == CACHE_MIN_COMPILE_SECS
    assert int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"]) > 0


def test_the_seconds_count_each_new_program_and_not_a_cached_call():
    import jax
    import jax.numpy as jnp
    from rl_core.runtime import compile_count, compile_seconds

    x = jnp.ones(7)  # eager ops compile programs of their own: before the counts
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + jnp.arange(7.0))
    count, seconds = compile_count(), compile_seconds()
    f(x).block_until_ready()  # a new program: compiled (or loaded), timed
    compiled = compile_seconds()
    assert compile_count() == count + 1 and compiled > seconds
    f(x).block_until_ready()  # the same program again: nothing compiled, no seconds added
    assert compile_count() == count + 1 and compile_seconds() == compiled
