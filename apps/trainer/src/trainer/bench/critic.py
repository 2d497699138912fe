"""`trainer bench` of a learner that trains a critic beside the policy (PPO): the critic's
update as a phase of its own.

The learner's update (`time/update`) trains the policy and then the critic on each mini-batch.
With a meter (rl_core.learner.meter) the learner times the critic's updates apart: before each it waits
for every model's pending work and after it for the critic's, so the seconds are the critic's
alone (on a real run the two would overlap a little in dispatch; here they are serialised, which
is what a per-phase time needs), and reports them as `time/critic_update`. Bench's `split` then
leaves a timed step's `time/update` the policy's share.

FLOPs of the critic (trainer.bench.flops' causal-forward model, nothing unembedded: the value
head's D weights per position are not counted, like the norms): its update is forward and
backward, 3 forwards over prompt + completion, per update; its values pass at collection time
is one forward over every row, counted in the log-prob phase, where the learner times it.
Model FLOPs feed every row's prompt and completion; needed FLOPs, what rl_core.policy.values feeds
and reads.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from trainer.bench.flops import forward_flops, scored_tokens

CRITIC = "critic"
PHASE = "critic_update"


def _forward_flops(config: Any, example: Any) -> tuple[float, float]:
    """(model, needed) FLOPs of one forward of the critic over the example's rows (stacked in any
    leading shape): model, over the prompt and the loss-masked completion; needed, over them but
    the completion's last token (rl_core.policy.values never feeds it), valued from the last prompt token on."""
    prompt = np.asarray(example.prompt_mask).reshape(-1, example.prompt_mask.shape[-1]).sum(axis=1)
    completion = np.asarray(example.completion_mask).reshape(-1, example.completion_mask.shape[-1]).sum(axis=1)
    tokens = scored_tokens(prompt, completion)
    nothing = np.zeros_like(completion)
    return (forward_flops(config, prompt + completion, nothing),
            forward_flops(config, tokens, np.zeros_like(tokens), completion))


def critic_config(learner: Any) -> Any:
    """The critic's backbone config (a critic_path model may differ from the policy's)."""
    return learner.models[CRITIC].module(learner.state.models[CRITIC].params).config


def critic_flops(config: Any, example: Any, passes: int) -> tuple[float, float]:
    """(model, needed) FLOPs of `passes` forwards of the critic over the example's rows."""
    model, needed = _forward_flops(config, example)
    return passes * model, passes * needed


def split(record: dict[str, Any]) -> dict[str, Any]:
    """A step's metrics with the critic's update seconds (the learner's `time/critic_update`,
    timed apart with a meter; rl_core.learner.meter) out of time/update."""
    seconds = record.get(f"time/{PHASE}", 0.0)
    return record | {"time/update": record["time/update"] - seconds, f"time/{PHASE}": seconds}


def critic_memory(learner: Any) -> dict[str, int]:
    """The critic's trained parameter count and per-device bytes of its parameters and optimizer state."""
    part = learner.state.models[CRITIC]

    def per_device(tree: Any) -> int:
        leaves = jax.tree.leaves(tree)
        return sum(x.addressable_shards[0].data.nbytes for x in leaves if hasattr(x, "addressable_shards"))

    return {"critic_trainable_parameters": sum(int(x.size) for x in jax.tree.leaves(part.params)),
            "critic_trained_bytes": per_device(part.params), "critic_optimizer_state_bytes": per_device(part.opt_state)}
