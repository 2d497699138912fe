"""GRPO on several (data, fsdp, tensor) meshes of 8 simulated CPU devices, against one device.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before jax is
imported). Prints one JSON line with, per mesh: the largest parameter
difference from the one-device run after three steps, whether greedy sampling
gave the same tokens, and the compile count of steps 2-3; and, for an
fsdp=4 mesh, the shard shapes of every parameter and optimizer moment.
"""

import json
import os

import jax
import numpy as np
from flax import nnx

import rewards
from algo_grpo import GRPOConfig, GRPOLearner
from rl_core.runtime import mesh as mesh_lib
from rl_core.runtime.compiles import compile_count
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.rollout.sampler import GREEDY
from rl_models import PAGED_TRANSFORMER, CharTokenizer, Transformer, TransformerConfig

TOK = CharTokenizer()
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 7) for b in range(1, 7)]
MESHES = [(1, 8, 1), (2, 2, 2), (1, 4, 2)]  # pure data parallelism: tests/rl_core/scripts/data_parallel.py
STEPS = 3
KEYS = ("train/", "rewards/", "completions/")


def digit_fraction(prompts, completions, **_):
    """Shaping reward that varies even for an untrained policy (so every step has a gradient)."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def make_learner(mesh, optimizer: str = "sgd", config: TransformerConfig | None = None,
                 async_rollout: str = "off", rollout_devices: int = 0, engine: str = "static",
                 packing: bool = False, max_staleness: int = 1) -> GRPOLearner:
    """SGD for the comparisons: Adam divides by sqrt(v), which turns 1e-7 rounding
    differences of near-zero gradient entries (another reduction order) into
    learning-rate-sized parameter differences; SGD shows the computation itself.
    Async rollouts need the truncated importance weight (tis_cap)."""
    return GRPOLearner(
        # beta: the reference pass runs; two iterations: the old-policy pass runs
        GRPOConfig(group_size=4, beta=0.04, num_iterations=2, tis_cap=None if async_rollout == "off" else 2.0),
        policy=Transformer(config or TransformerConfig.tiny(TOK.vocab_size), rngs=nnx.Rngs(0)),
        paging=PAGED_TRANSFORMER,
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(
            optimizer=optimizer, learning_rate=0.5, prompts_per_step=4, micro_batch_size=8, num_steps=STEPS,
            async_rollout=async_rollout, rollout_devices=rollout_devices, packing=packing,
            max_staleness=max_staleness,
        ),  # 16 rows a step: one mini-batch of two micro-batches of 8 rows
        rollout=RolloutConfig(max_prompt_tokens=8, max_new_tokens=6, temperature=1.0, seed=0, engine=engine),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), digit_fraction]),
        mesh=mesh,
    )


def params_numpy(learner) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(learner.params)]


def greedy_tokens(learner) -> list[list[int]]:
    tokens, mask = learner.generator.encode(PROMPTS[:8])
    return np.asarray(learner._generate(tokens, mask, GREEDY).tokens).tolist()


def run(mesh, config: TransformerConfig | None = None,
        packing: bool = False) -> tuple[list[np.ndarray], list[list[int]], list[int], list[dict]]:
    learner = make_learner(mesh, config=config, packing=packing)
    learner.train_step()
    compiles = [compile_count()]
    metrics = [learner.train_step() for _ in range(STEPS - 1)]
    compiles.append(compile_count())
    return params_numpy(learner), greedy_tokens(learner), compiles, metrics


def shards(mesh) -> dict:
    """Shard shapes on device 0 of each parameter and Adam moment, by parameter path."""
    learner = make_learner(mesh, "adamw")
    paths = ["/".join(map(str, p)) for p, _ in jax.tree_util.tree_flatten_with_path(learner.params)[0]]
    adam = learner.state.policy.opt_state[1][0]  # (clip, adamw chain) -> ScaleByAdamState
    out = {}
    for path, p, mu, nu in zip(paths, *(jax.tree.leaves(t) for t in (learner.params, adam.mu, adam.nu)), strict=True):
        out[path] = {
            "shape": list(p.shape),
            "param_shard": list(p.addressable_shards[0].data.shape),
            "mu_shard": list(mu.addressable_shards[0].data.shape),
            "nu_shard": list(nu.addressable_shards[0].data.shape),
            "bytes": int(p.nbytes),
            "device0_bytes": int(p.addressable_shards[0].data.nbytes),
        }
    return out


def whole_heads(devices) -> dict:
    """tensor=8 on a model of 8 query heads and 2 KV heads (head_dim 8): one query head per
    device, the KV heads replicated on 4 devices each; three steps against one device."""
    config = TransformerConfig.tiny(TOK.vocab_size, num_heads=8, num_kv_heads=2)
    one_params, one_tokens, _, _ = run(mesh_lib.make_mesh(devices=devices[:1]), config)
    mesh = mesh_lib.make_mesh(1, 1, 8, devices=devices)
    params, tokens, _, _ = run(mesh, config)
    layers = make_learner(mesh, config=config).params["layers"]["attn"]
    columns = lambda x: sorted({s.data.shape[-1] for s in x.addressable_shards})  # noqa: E731
    return {
        "params_max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(params, one_params, strict=True)),
        "same_greedy_tokens": tokens == one_tokens,
        "q_columns_per_device": columns(layers["q_proj"]["kernel"]),
        "k_columns_per_device": columns(layers["k_proj"]["kernel"]),
        "o_rows_per_device": sorted({s.data.shape[-2] for s in layers["o_proj"]["kernel"].addressable_shards}),
        "head_dim": config.head_dim,
    }


def hf_sharded(mesh) -> dict:
    """Each Hugging Face fixture loaded straight into shards on `mesh`: its logits and the
    rl_core sampler's greedy tokens against transformers' references."""
    from pathlib import Path

    from safetensors.numpy import load_file

    from rl_core.rollout.sampler import Sampler
    from rl_models.hf import load_hf_model, load_hf_tokenizer

    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "hf"
    out = {}
    for name in ("llama3", "qwen2", "qwen3"):
        ref = load_file(str(fixtures / "reference" / f"{name}.safetensors"))
        model = load_hf_model(fixtures / name, shardings=lambda state: mesh_lib.param_shardings(state, mesh))
        graphdef, state = nnx.split(model)
        params = nnx.to_pure_dict(state)
        ids, valid = ref["input_ids"], ref["attention_mask"]
        length = ids.shape[1]
        mask = np.tril(np.ones((length, length), bool))[None] & valid.astype(bool)[:, None, :]

        @jax.jit
        def logits(params):
            m = nnx.merge(graphdef, params)
            return m.logits(m(ids, ref["position_ids"], mask)[0])

        got = np.asarray(logits(params))
        real = valid.astype(bool)
        tok = load_hf_tokenizer(fixtures / name)
        shardings = jax.tree.map(lambda x: x.sharding, params)
        sampler = Sampler(graphdef, max_new_tokens=ref["greedy_ids"].shape[1], eos_ids=tok.eos_ids,
                          pad_id=tok.pad_id, mesh=mesh, param_shardings=shardings)
        greedy = sampler(params, ref["prompt_ids"], ref["prompt_mask"], jax.random.key(0), GREEDY)
        flat = jax.tree_util.tree_flatten_with_path(params)[0]
        fraction = {"/".join(map(str, path)): x.addressable_shards[0].data.size / x.size for path, x in flat if x.size >= 1024}
        out[name] = {
            "logits_max_abs_diff": float(np.max(np.abs(got[real] - ref["logits"][real]))),
            "same_greedy_tokens": np.asarray(greedy.tokens).tolist() == ref["greedy_ids"].tolist(),
            # k/v projections: 2 KV heads on tensor=4 replicate (whole heads), so only fsdp splits them
            "largest_shard_fraction": max(f for p, f in fraction.items() if "k_proj" not in p and "v_proj" not in p),
            "kv_shard_fraction": sorted({f for p, f in fraction.items() if "k_proj" in p or "v_proj" in p}),
        }
    return out


def rollouts_apart(devices, engine: str) -> dict:
    """Async GRPO training on fsdp=4 over devices 0-3 while devices 4-7 (training.rollout_devices=4)
    generate, against the same run generating on the training devices."""
    mesh = mesh_lib.make_mesh(1, 4, 1, devices=devices[:4])
    runs = {}
    for apart in (4, 0):
        learner = make_learner(mesh, async_rollout="one_step", rollout_devices=apart, engine=engine)
        metrics = [learner.train_step() for _ in range(STEPS)]
        runs[apart] = (learner, params_numpy(learner), metrics)
    learner, params, metrics = runs[4]
    backend = learner.generator.backend
    weights = backend._params if engine == "static" else backend.weights  # the pinned copy / the engine's own
    return {
        "params_max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(params, runs[0][1], strict=True)),
        "losses": [[m["train/loss"] for m in run[2]] for run in (runs[4], runs[0])],
        "staleness": [m["async/staleness"] for m in metrics],
        "param_devices": sorted({d.id for x in jax.tree.leaves(learner.params) for d in x.devices()}),
        "rollout_weight_devices": sorted({d.id for x in jax.tree.leaves(weights) for d in x.devices()}),
    }


def measure(devices) -> dict:
    """Every mesh's run against one device's, on `devices` (8)."""
    one_params, one_tokens, _, one_metrics = run(mesh_lib.make_mesh(devices=devices[:1]))
    result = {"device_count": len(devices), "meshes": {}}
    for shape in MESHES:
        mesh = mesh_lib.make_mesh(*shape, devices=devices)
        params, tokens, compiles, metrics = run(mesh)
        result["meshes"]["x".join(map(str, shape))] = {
            "params_max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(params, one_params, strict=True)),
            "same_greedy_tokens": tokens == one_tokens,
            "compiles_steps_2_3": compiles[1] - compiles[0],
            "metrics_max_abs_diff": max(
                abs(a[k] - b[k]) for a, b in zip(metrics, one_metrics, strict=True) for k in a if k.startswith(KEYS)
            ),
        }
    result["moved"] = max(float(np.max(np.abs(a - b))) for a, b in zip(one_params, params_numpy(make_learner(mesh_lib.make_mesh(devices=devices[:1]))), strict=True))
    result["packed"] = {}
    for shape in ((2, 2, 2),):  # training.packing on 4 row shards x tensor 2 (one device: test_core_packing)
        params, tokens, compiles, metrics = run(mesh_lib.make_mesh(*shape, devices=devices), packing=True)
        result["packed"]["x".join(map(str, shape))] = {
            "params_max_abs_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(params, one_params, strict=True)),
            "compiles_steps_2_3": compiles[1] - compiles[0],
            "metrics_max_abs_diff": max(
                abs(a[k] - b[k]) for a, b in zip(metrics, one_metrics, strict=True) for k in a if k.startswith(KEYS)
            ),
        }
    result["fsdp4"] = shards(mesh_lib.make_mesh(1, 4, 1, devices=devices[:4]))
    result["hf_1x2x4"] = hf_sharded(mesh_lib.make_mesh(1, 2, 4, devices=devices))
    result["whole_heads_1x1x8"] = whole_heads(devices)
    result["rollouts_apart"] = {engine: rollouts_apart(devices, engine) for engine in ("static", "paged")}
    return result


def main() -> None:
    devices = jax.devices()
    if os.environ.get("ONLY_HF"):  # a quick look while changing the loader
        print(json.dumps(hf_sharded(mesh_lib.make_mesh(1, 2, 4, devices=devices))))
        return
    print(json.dumps(measure(devices)))


if __name__ == "__main__":
    main()
