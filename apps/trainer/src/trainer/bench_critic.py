"""`trainer bench` of a learner that trains a critic beside the policy (PPO): the critic's
update as a phase of its own.

The learner's update (`time/update`) trains the policy and then the critic on each mini-batch.
Bench times the critic's updates apart: before each it waits for every model's pending work and
after it for the critic's, so the seconds are the critic's alone (on a real run the two would
overlap a little in dispatch; here they are serialised, which is what a per-phase time needs).
A timed step's `time/update` then keeps the policy's share and `time/critic_update` gets the
critic's.

FLOPs of the critic (trainer.bench_flops' causal-forward model, nothing unembedded: the value
head's D weights per position are not counted, like the norms): its update is forward and
backward, 3 forwards over prompt + completion, per update; its values pass at collection time
is one forward over every row, counted in the log-prob phase, where the learner times it.
Model FLOPs feed every row's prompt and completion; needed FLOPs, what rl_core.values feeds
and reads.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from trainer.bench_flops import forward_flops, scored_tokens

CRITIC = "critic"
PHASE = "critic_update"


def _forward_flops(config: Any, example: Any) -> tuple[float, float]:
    """(model, needed) FLOPs of one forward of the critic over the example's rows (stacked in any
    leading shape): model, over the prompt and the loss-masked completion; needed, over them but
    the completion's last token (rl_core.values never feeds it), valued from the last prompt token on."""
    prompt = np.asarray(example.prompt_mask).reshape(-1, example.prompt_mask.shape[-1]).sum(axis=1)
    completion = np.asarray(example.completion_mask).reshape(-1, example.completion_mask.shape[-1]).sum(axis=1)
    tokens = scored_tokens(prompt, completion)
    nothing = np.zeros_like(completion)
    return (forward_flops(config, prompt + completion, nothing),
            forward_flops(config, tokens, np.zeros_like(tokens), completion))


class CriticTimer:
    """Wraps a learner's critic update and values pass (see the module docstring)."""

    def __init__(self, learner: Any) -> None:
        part = learner.models[CRITIC]
        self.config = part.module(learner.model_state(CRITIC).params).config  # the critic's backbone (a critic_path model may differ)
        self.seconds, self.flops = 0.0, {PHASE: (0.0, 0.0), "logprob": (0.0, 0.0)}  # (model, needed)
        update, values = part.update, learner.critic_values

        def timed_update(state: Any, batch: Any) -> Any:
            jax.block_until_ready(state)  # the update in progress holds the models' states
            start = time.perf_counter()
            state, stats = update(state, batch)
            jax.block_until_ready(state.params)
            self.seconds += time.perf_counter() - start
            self._count(PHASE, batch, passes=3)  # forward and backward
            return state, stats

        def counted_values(example: Any) -> np.ndarray:
            out = values(example)
            self._count("logprob", example, passes=1)
            return out

        part.update = timed_update  # the learner calls models[name].update(mini): this one, for the critic
        learner.critic_values = counted_values

    def _count(self, phase: str, example: Any, passes: int) -> None:
        model, needed = _forward_flops(self.config, example)
        self.flops[phase] = (self.flops[phase][0] + passes * model, self.flops[phase][1] + passes * needed)

    def split(self, record: dict[str, Any]) -> dict[str, Any]:
        """A step's metrics with the critic's update seconds moved out of time/update into their own."""
        seconds, self.seconds = self.seconds, 0.0
        return record | {"time/update": record["time/update"] - seconds, f"time/{PHASE}": seconds}

    def take(self) -> dict[str, tuple[float, float]]:
        """The (model, needed) FLOPs counted since the last take, by phase."""
        flops, self.flops = self.flops, dict.fromkeys(self.flops, (0.0, 0.0))
        self.seconds = 0.0
        return flops


def critic_memory(learner: Any) -> dict[str, int]:
    """The critic's trained parameter count and per-device bytes of its parameters and optimizer state."""
    part = learner.model_state(CRITIC)

    def per_device(tree: Any) -> int:
        leaves = jax.tree.leaves(tree)
        return sum(x.addressable_shards[0].data.nbytes for x in leaves if hasattr(x, "addressable_shards"))

    return {"critic_trainable_parameters": sum(int(x.size) for x in jax.tree.leaves(part.params)),
            "critic_trained_bytes": per_device(part.params), "critic_optimizer_state_bytes": per_device(part.opt_state)}
