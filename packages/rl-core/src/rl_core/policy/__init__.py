"""The policy side: model protocols, log-probabilities, tokenization, frozen references, values."""

# The names the apps and algorithm packages import from this wing (loaded on first use, so importing the wing stays light).
from rl_core._faces import lazy_face  # noqa: E402

__getattr__, __dir__, _LAZY = lazy_face(__name__, {
    "rl_core.policy.logprobs": ("sequence_inputs",),
    "rl_core.policy.protocols": ("decode_cache",),
    "rl_core.policy.tokens": ("left_pad",),
    "rl_core.policy.values": ("completion_values", "written_logp"),
})
__all__ = sorted(_LAZY)
