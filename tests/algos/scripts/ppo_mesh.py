"""PPO (policy and critic) on a fsdp=2 x tensor=2 mesh of 4 simulated CPU devices, against one device.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=4 (set before jax is
imported). Prints one JSON line: the largest difference from the one-device run
after two steps of the policy's and of the critic's parameters and of the logged
metrics, how far each model moved, and the per-device shard of a critic kernel.
One mesh, as each costs its own compiles (~8 s on one core): fsdp splits rows,
parameters and optimizer state, tensor splits heads and the MLP.
"""

import json

import jax
import numpy as np
from flax import nnx

import rewards
from algo_ppo import PPOConfig, PPOLearner
from rl_core.runtime import mesh as mesh_lib
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_models import CharTokenizer, Transformer, TransformerConfig, value_model_from_policy

TOK = CharTokenizer()
# one layer, 4 heads of 8 and 2 KV heads: the tensor axis still splits heads and the MLP
MODEL = TransformerConfig.tiny(TOK.vocab_size, hidden_size=32, num_layers=1, mlp_hidden_size=64)
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 7) for b in range(1, 7)]
MESH = (1, 2, 2)
STEPS = 2
KEYS = ("train/", "critic/", "rewards/")
"""The metrics compared: the policy's loss and gradient norm, the critic's, the rewards."""


def length_fraction(prompts, completions, **_):
    """Shaping reward that varies even for an untrained policy (so every step has a gradient)."""
    return [len(text) / 6 for text in completions]


def make_learner(mesh) -> PPOLearner:
    """SGD (see mesh_parallel.py: Adam would amplify reduction-order rounding). beta = 0 and one
    mini-batch: no reference or behaviour pass, which are GRPO's, tested on meshes there; what is
    PPO's own here is the critic's values pass, GAE over them and the critic's update."""
    policy = Transformer(MODEL, rngs=nnx.Rngs(0))
    return PPOLearner(
        PPOConfig(beta=0.0, critic_learning_rate=0.2),
        policy=policy,
        critic=value_model_from_policy(policy),
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(optimizer="sgd", learning_rate=0.5, prompts_per_step=8, num_steps=STEPS),
        rollout=RolloutConfig(max_prompt_tokens=8, max_new_tokens=6, temperature=1.0, seed=0),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), length_fraction]),
        mesh=mesh,
    )


def leaves(tree) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(tree))]


def params(learner: PPOLearner) -> dict[str, list[np.ndarray]]:
    return {name: leaves(model.params) for name, model in learner.state.models.items()}


def max_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def measure(devices) -> dict:
    """PPO on a mesh of `devices` (4) against one device."""
    one = make_learner(mesh_lib.make_mesh(devices=devices[:1]))
    start = params(one)
    one_metrics = [one.train_step() for _ in range(STEPS)]
    learner = make_learner(mesh_lib.make_mesh(*MESH, devices=devices))
    metrics = [learner.train_step() for _ in range(STEPS)]
    gate = learner.state.models["critic"].params["backbone"]["layers"]["mlp"]["gate_proj"]["kernel"]
    return {
        "device_count": len(devices),
        "moved": {name: max_diff(p, start[name]) for name, p in params(one).items()},
        "params_max_abs_diff": {name: max_diff(p, params(one)[name]) for name, p in params(learner).items()},
        "metrics_max_abs_diff": max(
            abs(m[k] - o[k]) for m, o in zip(metrics, one_metrics, strict=True) for k in o if k.startswith(KEYS)
        ),
        "critic_metrics": sorted(k for k in one_metrics[-1] if k.startswith("critic/")),
        "critic_gate_kernel": {"shape": list(gate.shape), "shard": list(gate.addressable_shards[0].data.shape)},
    }


def main() -> None:
    print(json.dumps(measure(jax.devices())))


if __name__ == "__main__":
    main()
