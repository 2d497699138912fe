"""Training steps: trainable state, optimizers, batch layout, packing, trimming, the objective, update stats."""

# The names the apps and algorithm packages import from this wing (loaded on first use, so importing the wing stays light).
from rl_core._faces import lazy_face  # noqa: E402

__getattr__, __dir__, _LAZY = lazy_face(__name__, {
    "rl_core.train.behaviour": ("LogprobPasses", "logprob_fn"),
    "rl_core.train.packing": ("pack", "pack_micro_batches", "padded_positions"),
    "rl_core.train.trainable": (
        "ModelShardings", "abstract_model", "forward_program", "make_update", "model_shardings", "update_program",
    ),
    "rl_core.train.trim": ("trim_example", "trimmed_width"),
})
__all__ = sorted(_LAZY)
