"""GRPO on a tiny mixture of experts with an expert mesh axis, on 8 simulated CPU devices.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before jax is imported). Prints
one JSON line: per mesh (expert=8; fsdp=2 x expert=2 x tensor=2), the largest parameter and
metric differences from one device after two GRPO steps (SGD, so rounding stays rounding), the
greedy tokens against one device's, the logit gap of gpt-oss's form of the experts (biases, the
clamped SwiGLU) on a token count the devices do not divide, each expert weight's shard, and the collectives of the
compiled update and of the static sampler's program (prefill and the decode loop), with the
shapes of every all-gather, so the test can say which weights moved.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import rewards
from algo_grpo import GRPOConfig, GRPOLearner
from rl_core import registry
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.rollout.sampler import GREEDY
from rl_core.runtime import hlo
from rl_core.runtime import mesh as mesh_lib
from rl_core.train.objective import policy_loss_function
from rl_core.train.trainable import TrainState, update_program
from rl_core.types import TrainExample
from rl_models import PAGED_TRANSFORMER, CharTokenizer, Transformer, TransformerConfig

TOK = CharTokenizer()
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 7) for b in range(1, 7)]
# 8 experts of width 48 (k = 2) in D = 64: an expert weight is [8, 64, 48] (a layer) or [2, 8, 64, 48]
CONFIG = TransformerConfig.tiny(TOK.vocab_size, num_experts=8, experts_per_token=2, moe_hidden_size=48,
                                scan_layers=True)
MESHES = {"expert8": dict(expert=8, fsdp=1), "fsdp2_expert2_tensor2": dict(fsdp=2, expert=2, tensor=2)}
STEPS = 2
KEYS = ("train/", "rewards/", "completions/")


def digit_fraction(prompts, completions, **_):
    """Shaping reward that varies even for an untrained policy (so every step has a gradient)."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def make_learner(mesh) -> GRPOLearner:
    return GRPOLearner(
        GRPOConfig(group_size=4, beta=0.04, num_iterations=2),  # the reference and old-policy passes run
        policy=Transformer(CONFIG, rngs=nnx.Rngs(0)),
        paging=PAGED_TRANSFORMER,
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(optimizer="sgd", learning_rate=0.5, prompts_per_step=4, micro_batch_size=8,
                                num_steps=STEPS),
        rollout=RolloutConfig(max_prompt_tokens=8, max_new_tokens=6, temperature=1.0, seed=0, engine="static"),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), digit_fraction]),
        mesh=mesh,
    )


def run(mesh) -> tuple[GRPOLearner, list[np.ndarray], list[list[int]], list[dict]]:
    learner = make_learner(mesh)
    metrics = [learner.train_step() for _ in range(STEPS)]
    tokens, mask = learner.generator.encode(PROMPTS[:8])
    greedy = np.asarray(learner._generate(tokens, mask, GREEDY).tokens).tolist()
    return learner, [np.asarray(x) for x in jax.tree.leaves(learner.params)], greedy, metrics


def programs(learner) -> dict:
    """The compiled HLO text of the learner's update program (rl_core.train.trainable.update_program,
    with its shardings and optimizer) of GRPO's default loss on two micro-batches of 8 rows, and of
    the learner's static sampler program (prefill + decode loop) on 8 prompts."""
    part = learner.models["policy"]
    grpo = registry.get_algorithm("grpo").config()
    rollout = RolloutConfig(max_prompt_tokens=8, max_new_tokens=6)
    program = update_program(part.graphdef, part.tx, policy_loss_function(grpo, rollout, beta=grpo.beta),
                             part.model_shardings, part.layout.mesh)
    rows = mesh_lib.rows(part.layout.mesh, axis=1)
    batch = lambda width, dtype: jax.ShapeDtypeStruct((2, 8, width), dtype, sharding=rows)  # noqa: E731
    xs = TrainExample(prompt_tokens=batch(8, jnp.int32), prompt_mask=batch(8, jnp.float32),
                      completion_tokens=batch(6, jnp.int32), completion_mask=batch(6, jnp.float32),
                      advantages=jax.ShapeDtypeStruct((2, 8), jnp.float32, sharding=rows),
                      ref_logp=batch(6, jnp.float32), sampler_logp=batch(6, jnp.float32))
    state = TrainState(learner.params, learner.state.policy.opt_state)
    update = program.lower(state, part.frozen, xs).compile().as_text()
    tokens, mask = learner.generator.encode(PROMPTS[:8])
    weights = part.whole_params(learner.params)
    decode = learner.generator.sampler._jit(True, True).lower(weights, tokens, mask, jax.random.key(0), GREEDY,
                                                    1).compile().as_text()
    return {"update": update, "decode": decode}


def gpt_oss_form_gap(mesh) -> float:
    """The largest logit gap, sharded forward against one device, of gpt-oss's form of the
    experts (router and expert biases, random, so the down bias added once after the sum over
    tensor shows; the clamped SwiGLU; top-k then softmax) on 3 rows of 5 tokens: 15 tokens, which
    the 8 row shards do not divide (padded inside the dispatch)."""
    config = TransformerConfig.tiny(TOK.vocab_size, num_experts=8, experts_per_token=2, moe_hidden_size=48,
                                    expert_bias=True, router_bias=True, swiglu_limit=7.0, swiglu_alpha=1.702,
                                    router="topk_softmax")
    model = Transformer(config, rngs=nnx.Rngs(0))
    for i, name in enumerate(("gate_bias", "up_bias", "down_bias")):
        bias = getattr(model.layers.mlp, name)
        bias[...] = jax.random.normal(jax.random.key(i), bias.shape)
    ids = jax.random.randint(jax.random.key(7), (3, 5), 0, TOK.vocab_size)
    positions = jnp.broadcast_to(jnp.arange(5), (3, 5))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((5, 5), bool)), (3, 5, 5))

    def forward(model, ids, positions, mask):
        return model.logits(model(ids, positions, mask)[0])

    one = np.asarray(jax.jit(forward)(model, ids, positions, mask))
    graphdef, state = nnx.split(model)
    sharded = nnx.merge(graphdef, jax.device_put(state, mesh_lib.param_shardings(state, mesh)))
    on_mesh = np.asarray(jax.jit(mesh_lib.with_activation_layout(mesh, forward))(sharded, ids, positions, mask))
    return float(np.abs(on_mesh - one).max())


def describe(text: str) -> dict:
    ops = hlo.collectives(text)
    return {"kinds": hlo.count(text), "all_gathers": [list(dims) for c in ops if c.kind == "all-gather"
                                                      for dims, _ in hlo.arrays(c)]}


def measure(devices) -> dict:
    _, one_params, one_tokens, one_metrics = run(mesh_lib.make_mesh(devices=devices[:1]))
    result = {"device_count": len(devices), "meshes": {}}
    for name, shape in MESHES.items():
        mesh = mesh_lib.make_mesh(devices=devices, **shape)
        learner, params, tokens, metrics = run(mesh)
        gate = learner.params["layers"]["mlp"]["gate_proj"]
        texts = programs(learner)
        result["meshes"][name] = {
            "params_max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(params, one_params, strict=True)),
            "metrics_max_abs_diff": max(abs(a[k] - b[k]) for a, b in zip(metrics, one_metrics, strict=True)
                                        for k in a if k.startswith(KEYS)),
            "same_greedy_tokens": tokens == one_tokens,
            "gpt_oss_form_logit_gap": gpt_oss_form_gap(mesh),
            "gate_shape": list(gate.shape),
            "gate_shard": list(gate.sharding.shard_shape(gate.shape)),
            **{program: describe(text) for program, text in texts.items()},
        }
    return result


if __name__ == "__main__":
    print(json.dumps(measure(jax.devices()[:8])))
