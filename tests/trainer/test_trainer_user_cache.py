"""The trainer keeps compiled programs in rl-variants/jax of the user's cache folder
(trainer.user_cache): a second process loads what the first compiled; JAX's own switches move it
or turn it off; a folder that cannot be made costs compile time, not the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
from trainer.user_cache import use_compilation_cache, user_cache_dir

SCRIPT = """
import json
import jax, jax.numpy as jnp
from jax import monitoring
from trainer.user_cache import use_compilation_cache
folder = use_compilation_cache()
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # this program compiles in milliseconds
hits = []
monitoring.register_event_listener(lambda event, **_: hits.append(event) if event.endswith("cache_hits") else None)
jax.jit(lambda x: jnp.cumsum(jnp.sin(x)) @ x)(jnp.ones(16)).block_until_ready()
print(json.dumps({"folder": str(folder), "loaded": len(hits)}))
"""


def run(env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_what_the_first_compiled_from_the_users_cache_folder(tmp_path):
    # the suite's own cache settings (conftest) are JAX_* variables: without them, the trainer's defaults
    # (JAX_PLATFORMS kept: on a TPU host the children run on the CPU, this process holds the chip)
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_") or k == "JAX_PLATFORMS"}
    env |= {"XDG_CACHE_HOME": str(tmp_path)}
    folder = tmp_path / "rl-variants" / "jax"
    first = run(env)
    entries = sorted(p.name for p in folder.iterdir())
    second = run(env)
    # every program the first compiled and wrote (the jitted function, jnp.ones's), the second loaded
    written = sum(name.endswith("-cache") for name in entries)
    assert written >= 2 and any(name.startswith("jit__lambda-") for name in entries)
    assert first == {"folder": str(folder), "loaded": 0} and second == {"folder": str(folder), "loaded": written}


def test_jaxs_own_switches_move_the_cache_or_turn_it_off(tmp_path):
    """Neither touches this process's cache settings: the user's folder is JAX's to read, and off is off."""
    other = tmp_path / "elsewhere"
    assert use_compilation_cache({"JAX_COMPILATION_CACHE_DIR": str(other)}) == other
    before = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)  # what JAX_ENABLE_COMPILATION_CACHE=false sets
    try:
        assert use_compilation_cache({"XDG_CACHE_HOME": str(tmp_path / "off")}) is None
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
    assert not (tmp_path / "off").exists() and not other.exists()


def test_the_cache_folder_is_in_the_users_cache_home():
    assert user_cache_dir("jax", {"XDG_CACHE_HOME": "/c"}) == Path("/c/rl-variants/jax")
    assert user_cache_dir("models", {}) == Path.home() / ".cache" / "rl-variants" / "models"


def test_a_folder_that_cannot_be_made_turns_the_cache_off_with_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a file where the cache home should be: no folder under it, not even for root
    said = []
    assert jax.config.jax_enable_compilation_cache  # else this would test the switch, not the folder
    assert use_compilation_cache({"XDG_CACHE_HOME": str(blocker)}, warn=said.append) is None
    (line,) = said
    assert line.startswith(f"compilation cache off: cannot make {blocker}/rl-variants/jax (Not a directory)")
