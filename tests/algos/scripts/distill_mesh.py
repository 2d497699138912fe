"""On-policy distillation (opd) on (data, fsdp, tensor) meshes of 8 simulated CPU devices, against one device.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before jax is imported), or through
tests/support/simulated_devices.py. Prints one JSON line with, per mesh: the largest difference
of the first batch's teacher log-probs and of the parameters after two steps from the one-device run,
and the largest share of a teacher weight one device holds (the teacher is laid out like the student).
"""

import dataclasses
import json

import jax
import numpy as np
from flax import nnx

import rewards
from rl_core import registry
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.runtime import mesh as mesh_lib
from rl_models import CharTokenizer, Transformer, TransformerConfig

TOK = CharTokenizer()
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 7) for b in range(1, 7)]
MESHES = [(1, 8, 1), (2, 2, 2)]
STEPS = 2


def make_learner(mesh):
    """SGD (as tests/algos/scripts/mesh_parallel.py: Adam would magnify reduction-order rounding);
    16 rows a step in two micro-batches of 8; the teacher another tiny model's weights."""
    algorithm = registry.get_algorithm("opd")
    model = TransformerConfig.tiny(TOK.vocab_size)
    return algorithm.learner(
        dataclasses.replace(algorithm.config(), group_size=4, teacher="tiny, seed 1"),
        policy=Transformer(model, rngs=nnx.Rngs(0)), teacher=Transformer(model, rngs=nnx.Rngs(1)),
        tokenizer=TOK, train_data=PROMPTS,
        training=TrainingConfig(optimizer="sgd", learning_rate=0.5, prompts_per_step=4, micro_batch_size=8,
                                num_steps=STEPS),
        rollout=RolloutConfig(max_prompt_tokens=8, max_new_tokens=6, temperature=1.0, seed=0),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward()]), mesh=mesh,
    )  # fmt: skip


def run(mesh) -> tuple[np.ndarray, list[np.ndarray], float, float]:
    learner = make_learner(mesh)
    example = learner.produce_examples(PROMPTS[:4]).example
    teacher_logp = np.where(np.asarray(example.completion_mask) > 0, np.asarray(example.teacher_logp), 0.0)
    kl = [learner.train_step()["train/distill_reverse_kl"] for _ in range(STEPS)]
    shard = max(x.addressable_shards[0].data.size / x.size for x in jax.tree.leaves(learner._teacher.params)
                if x.size >= 1024)
    return teacher_logp, [np.asarray(x) for x in jax.tree.leaves(learner.params)], kl[-1], shard


def measure(devices) -> dict:
    one_logp, one_params, one_kl, _ = run(mesh_lib.make_mesh(devices=devices[:1]))
    result = {"device_count": len(devices), "one_device_kl": one_kl, "meshes": {}}
    for shape in MESHES:
        logp, params, kl, shard = run(mesh_lib.make_mesh(*shape, devices=devices))
        result["meshes"]["x".join(map(str, shape))] = {
            "teacher_logp_max_abs_diff": float(np.max(np.abs(logp - one_logp))),
            "params_max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(params, one_params, strict=True)),
            "kl_abs_diff": abs(kl - one_kl),
            "largest_teacher_shard_fraction": shard,
        }
    return result


if __name__ == "__main__":
    print(json.dumps(measure(jax.devices())))
