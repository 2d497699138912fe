"""Is PPO's critic short of information or short of training? A probe trained to convergence.

    uv run python benchmarks/critic_probe.py [--steps 50] [--probe-steps 3000] [--base-cache DIR] [key=value ...]

Trains PPO as benchmarks/ppo_critic.py does (its settings; `key=value` on top) for --steps,
then samples six sets of held-out rollouts (one completion per problem, keys of their own).
On four of them it fits a probe from what the critic can read at each completion token to
the return: the hidden state of the backbone the critic started from (the base policy's,
frozen) and the three confidence features of `rl_models.value.prefix_confidence`, z-scored,
through one hidden layer (256 GELU units; Adam at 1e-3 on batches of 512 tokens). It
prints, on the other two sets, the explained variance of the critic's own values and of
the probe after 50, 200, 1000 and --probe-steps steps.

The probe sees rollouts of one policy only (the current one) and as many updates as
asked; the critic gets four updates per PPO step, each on rollouts of a policy that then
moves on. Where the probe ends far above the critic, the inputs hold what the critic has
not learned yet.
"""

import argparse
import json
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from algo_ppo.learner import HELDOUT_SEED
from ppo_critic import RUN
from rl_core.policy import sequence_inputs, written_logp
from rl_core import explained_variance
from rl_models.value import prefix_confidence
from trainer import build
from trainer.run import load_task
from trainer.settings import build_settings

CHECKPOINTS = (50, 200, 1000)


def rollouts(learner, base, prompts, rep: int) -> dict[str, np.ndarray]:
    """One held-out set: token mask, rewards, the critic's values and the probe's inputs [B, T, D + 3]."""
    key = jax.random.fold_in(jax.random.PRNGKey(HELDOUT_SEED + 1 + rep), learner.step)
    groups, example = learner.heldout_rollouts(prompts, key)
    p, t = example.prompt_tokens.shape[1], example.completion_tokens.shape[1]
    positions, mask = sequence_inputs(jnp.asarray(example.prompt_mask), t)
    tokens = jnp.concatenate([jnp.asarray(example.prompt_tokens), jnp.asarray(example.completion_tokens)], axis=1)
    hidden, _ = base(tokens, positions, mask)
    logp = jnp.concatenate([jnp.zeros(example.prompt_tokens.shape, jnp.float32), written_logp(example)], axis=1)
    # the value of completion token j is read where token j - 1 sits (rl_core.policy.values.completion_values)
    inputs = jnp.concatenate([hidden.astype(jnp.float32), prefix_confidence(logp)], axis=-1)[:, p - 1 : p + t - 1]
    return {"mask": groups.completion_mask, "rewards": groups.rewards, "inputs": np.asarray(inputs),
            "critic": learner.critic_values(example)}


def fit_probe(train: list[dict], test: list[dict], steps: int) -> dict[int, list[float]]:
    """Held-out explained variance of the probe (module docstring) on each test set, by probe step."""
    x = np.concatenate([s["inputs"][s["mask"] > 0] for s in train])
    y = np.concatenate([np.broadcast_to(s["rewards"][:, None], s["mask"].shape)[s["mask"] > 0] for s in train])
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-6
    x, y = jnp.asarray((x - mean) / scale), jnp.asarray(y, jnp.float32)
    key = jax.random.PRNGKey(0)
    params = {"w": jax.random.normal(key, (x.shape[1], 256)) / x.shape[1] ** 0.5, "a": jnp.zeros(256),
              "u": jnp.zeros(256), "b": jnp.zeros(())}

    def probe(params, inputs):
        return jax.nn.gelu(inputs @ params["w"] + params["a"]) @ params["u"] + params["b"]

    optimizer = optax.adam(1e-3)
    state = optimizer.init(params)

    @jax.jit
    def update(params, state, key):
        rows = jax.random.choice(key, x.shape[0], (512,))
        grads = jax.grad(lambda q: jnp.mean(jnp.square(probe(q, x[rows]) - y[rows])))(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    out = {}
    for step in range(1, steps + 1):
        params, state = update(params, state, jax.random.fold_in(key, step))
        if step in (*CHECKPOINTS, steps):
            out[step] = [fit(np.asarray(probe(params, jnp.asarray((s["inputs"] - mean) / scale))), s) for s in test]
    return out


def fit(values: np.ndarray, rollout_set: dict) -> float:
    """Explained variance of `values` of the Monte Carlo return (gamma = 1: the reward at every token)."""
    mask = rollout_set["mask"]
    return round(float(explained_variance(values * mask, rollout_set["rewards"][:, None] * mask, mask)), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="PPO steps before the probe")
    parser.add_argument("--probe-steps", type=int, default=3000)
    parser.add_argument("--base-cache", type=Path, default=None, help="folder for the warm-started base policy")
    parser.add_argument("overrides", nargs="*", metavar="key=value")
    args = parser.parse_args()
    settings = build_settings(algo="ppo", overrides=[*RUN, f"training.num_steps={max(args.steps, 1)}",
                                                     "eval.heldout_size=500", *args.overrides])
    tokenizer = build.tokenizer(settings)
    task = load_task(settings, tokenizer, lambda _: None)
    cache = args.base_cache or Path(tempfile.mkdtemp())
    base = build.base_policy(settings, task, tokenizer, build.new_model(settings, tokenizer), cache, print)
    policy = build.base_policy(settings, task, tokenizer, build.new_model(settings, tokenizer), cache, print)
    learner = build.learner(settings, task, tokenizer, build.adapted(settings, policy), output_dir=None,
                            progress=False)
    prompts = build.heldout(task, settings)
    while learner.step < args.steps:
        learner.train_step()
    sets = [rollouts(learner, base, prompts, rep) for rep in range(6)]
    probe = fit_probe(sets[:4], sets[4:], args.probe_steps)
    print(json.dumps({"step": learner.step, "critic_ev": [fit(s["critic"], s) for s in sets[4:]],
                      "probe_ev": {str(k): v for k, v in probe.items()}}))


if __name__ == "__main__":
    main()
