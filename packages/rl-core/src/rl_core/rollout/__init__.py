"""Rollout backends: the protocol (`backend`), the static sampler (`static`) and the
paged continuous-batching engine (`paged`)."""

# The names the apps and algorithm packages import from this wing (loaded on first use, so importing the wing stays light).
from rl_core._faces import lazy_face  # noqa: E402

__getattr__, __dir__, _LAZY = lazy_face(__name__, {
    "rl_core.rollout.async_rollout": ("Collection",),
    "rl_core.rollout.attention": ("PallasKV", "lane_layout", "pack_heads", "reference_paged_attention"),
    "rl_core.rollout.backend": ("Capabilities", "EngineCounters", "Requests"),
    "rl_core.rollout.engines": ("Engine", "EngineBuild", "offering"),
    "rl_core.rollout.factory": ("explain_engine", "make_backend", "resolve_engine"),
    "rl_core.rollout.memory": ("MemoryQuery", "argument_bytes", "memory_elsewhere", "per_device"),
    "rl_core.rollout.moved_keys": ("moved_into_options",),
    "rl_core.rollout.paged": ("PagedBackend",),
    "rl_core.rollout.ragged": ("RaggedKV", "combined_slots", "ragged_layout", "ragged_tpu", "token_lanes", "wide"),
    "rl_core.rollout.paged_settings": ("EngineSettings", "PagedSettings"),
    "rl_core.rollout.scheduler": ("HostLoop", "LoopEngine"),
    "rl_core.rollout.serving": ("EngineLoop", "Job", "Sample", "cut_at_stop"),
    "rl_core.rollout.static": ("StaticBackend",),
})
__all__ = sorted(_LAZY)
