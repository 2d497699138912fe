"""The runtime: device meshes, multi-host setup, compilation caching, CPU randomness, host memory, HLO."""

# The names the apps and algorithm packages import from this wing (loaded on first use, so importing the wing stays light).
from rl_core._faces import lazy_face  # noqa: E402

__getattr__, __dir__, _LAZY = lazy_face(__name__, {
    "rl_core.runtime.compiles": ("compile_count", "compile_seconds", "use_persistent_cache"),
    "rl_core.runtime.cpu_random": ("unroll_threefry_on_cpu",),
    "rl_core.runtime.host_memory": ("keep_freed_memory",),
})
__all__ = sorted(_LAZY)
