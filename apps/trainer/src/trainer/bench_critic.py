"""`trainer bench` of a learner that trains a critic beside the policy (PPO): the critic's
update as a phase of its own.

The learner's update (`time/update`) trains the policy and then the critic on each mini-batch.
Bench times the critic's updates apart: before each it waits for every model's pending work and
after it for the critic's, so the seconds are the critic's alone (on a real run the two would
overlap a little in dispatch; here they are serialised, which is what a per-phase time needs).
A timed step's `time/update` then keeps the policy's share and `time/critic_update` gets the
critic's.

Model FLOPs of the critic (trainer.bench's causal-forward model, nothing unembedded: the value
head's D weights per position are not counted, like the norms): its update is forward and
backward, 3 forwards over prompt + completion, per update; its values pass at collection time
is one forward over every row, counted in the log-prob phase, where the learner times it.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import numpy as np

from trainer.bench_flops import scored_tokens

CRITIC = "critic"
PHASE = "critic_update"


def _tokens(example: Any) -> tuple[np.ndarray, np.ndarray]:
    """(real tokens fed in, positions valued) per row, rows stacked in any leading shape: the
    prompt and the loss-masked completion but its last token (rl_core.values never feeds it),
    valued from the last prompt token on."""
    prompt = np.asarray(example.prompt_mask).reshape(-1, example.prompt_mask.shape[-1]).sum(axis=1)
    completion = np.asarray(example.completion_mask).reshape(-1, example.completion_mask.shape[-1]).sum(axis=1)
    return scored_tokens(prompt, completion), completion


class CriticTimer:
    """Wraps a learner's critic update and values pass (see the module docstring)."""

    def __init__(self, learner: Any, forward_flops: Any) -> None:
        part = learner.models[CRITIC]
        self.config = part.module().config  # the critic's backbone (a critic_path model may differ)
        self.seconds, self.flops = 0.0, {PHASE: 0.0, "logprob": 0.0}
        update, values = part.update, learner.critic_values

        def timed_update(batch: Any) -> Any:
            jax.block_until_ready([model.params for model in learner.models.values()])
            start = time.perf_counter()
            stats = update(batch)
            jax.block_until_ready(part.params)
            self.seconds += time.perf_counter() - start
            tokens, valued = _tokens(batch)
            self.flops[PHASE] += 3.0 * forward_flops(self.config, tokens, np.zeros_like(tokens), valued)
            return stats

        def counted_values(example: Any) -> np.ndarray:
            out = values(example)
            tokens, valued = _tokens(example)
            self.flops["logprob"] += forward_flops(self.config, tokens, np.zeros_like(tokens), valued)
            return out

        part.update = timed_update  # the learner calls models[name].update(mini): this one, for the critic
        learner.critic_values = counted_values

    def split(self, record: dict[str, Any]) -> dict[str, Any]:
        """A step's metrics with the critic's update seconds moved out of time/update into their own."""
        seconds, self.seconds = self.seconds, 0.0
        return record | {"time/update": record["time/update"] - seconds, f"time/{PHASE}": seconds}

    def take(self) -> dict[str, float]:
        """The FLOPs counted since the last take, by phase."""
        flops, self.flops = self.flops, dict.fromkeys(self.flops, 0.0)
        self.seconds = 0.0
        return flops


def critic_memory(learner: Any) -> dict[str, int]:
    """The critic's trained parameter count and per-device bytes of its parameters and optimizer state."""
    part = learner.models[CRITIC]

    def per_device(tree: Any) -> int:
        leaves = jax.tree.leaves(tree)
        return sum(x.addressable_shards[0].data.nbytes for x in leaves if hasattr(x, "addressable_shards"))

    return {"critic_trainable_parameters": sum(int(x.size) for x in jax.tree.leaves(part.params)),
            "critic_trained_bytes": per_device(part.params), "critic_optimizer_state_bytes": per_device(part.opt_state)}
