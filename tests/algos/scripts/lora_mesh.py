"""GRPO with LoRA on (data, fsdp, tensor) meshes of 8 simulated CPU devices, against one device.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before jax is
imported). Prints one JSON line: per mesh, the largest adapter difference from
the one-device run after three steps and whether the frozen base is unchanged;
and, on an fsdp=4 x tensor=2 mesh, the shard shapes of the frozen base kernels.
"""

import json

import jax
import numpy as np
from flax import nnx

import rewards
from algo_grpo import GRPOConfig, GRPOLearner
from rl_core.runtime import mesh as mesh_lib
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_models import CharTokenizer, Transformer, TransformerConfig
from rl_models.lora import add_adapters

TOK = CharTokenizer()
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 7) for b in range(1, 7)]
MESHES = [(1, 4, 2), (2, 2, 2)]


def digit_fraction(prompts, completions, **_):
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def make_learner(mesh) -> GRPOLearner:
    """SGD (see mesh_parallel.py: Adam would amplify reduction-order rounding); beta and two
    iterations so that the reference and old-policy passes run."""
    policy = add_adapters(Transformer(TransformerConfig.tiny(TOK.vocab_size), rngs=nnx.Rngs(0)), rank=4, alpha=8.0)
    return GRPOLearner(
        GRPOConfig(group_size=4, beta=0.04, num_iterations=2),
        policy=policy,
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(optimizer="sgd", learning_rate=0.5, prompts_per_step=4, micro_batch_size=8, num_steps=3),
        rollout=RolloutConfig(max_prompt_tokens=8, max_new_tokens=6, temperature=1.0, seed=0),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), digit_fraction]),
        mesh=mesh,
    )


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def measure(devices) -> dict:
    """LoRA on each mesh of `devices` (8) against one device."""
    one = make_learner(mesh_lib.make_mesh(devices=devices[:1]))
    start, base = leaves(one.params), leaves(one.policy.frozen)
    for _ in range(3):
        one.train_step()
    result = {"device_count": len(devices), "moved": max(float(np.abs(a - b).max()) for a, b in zip(leaves(one.params), start)),
              "meshes": {}}
    for shape in MESHES:
        learner = make_learner(mesh_lib.make_mesh(*shape, devices=devices))
        for _ in range(3):
            learner.train_step()
        result["meshes"]["x".join(map(str, shape))] = {
            "adapters_max_abs_diff": max(float(np.abs(a - b).max()) for a, b in zip(leaves(learner.params), leaves(one.params))),
            "base_unchanged": all(np.array_equal(a, b) for a, b in zip(leaves(learner.policy.frozen), base)),
        }
        if shape == (1, 4, 2):
            q = learner.policy.frozen["layers"]["attn"]["q_proj"]["kernel"]  # [layers, embed, heads]
            result["q_kernel"] = {"shape": list(q.shape), "shard": list(q.addressable_shards[0].data.shape)}
    return result


def main() -> None:
    print(json.dumps(measure(jax.devices())))


if __name__ == "__main__":
    main()
