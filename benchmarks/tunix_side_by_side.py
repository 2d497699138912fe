"""One GRPO step of this project beside one of Tunix's GRPO learner, on the same chip, shape and batch.

    PYTHONPATH=.tunix-site uv run python benchmarks/tunix_side_by_side.py [--preset tiny-qwen2] [--rounds 3]
        [--warmup 1] [--schedule alternate|sequential] [--only project|tunix] [--remat auto|none|full] [--packing]
        [--tunix-micro-batch N] [--beta 0] [--compile-cache DIR] [--against earlier.json] [--out result.json]

Tunix (`google-tunix`, pinned with what it needs beyond this workspace in
benchmarks/tunix-requirements.txt) is never a dependency of the workspace: install it into its own
folder and put that on PYTHONPATH (benchmarks/README.md; on a TPU host docs/on-a-tpu.md).

Both legs run `trainer bench`'s preset (--preset: `tiny-qwen2` for a CPU, `qwen2.5-0.5b-shape` for
one TPU chip): the same Qwen2 shape (Tunix's own `tunix.models.qwen2` model, built from the
project's config), float32 weights with the preset's compute dtype, random weights from the same
seed (each model's own initialiser), the same prompts (the preset's first batch of additions, BOS
first, left-padded to the same width), prompts x samples, new tokens, temperature 1, AdamW at 1e-5,
one mini-batch and one iteration, beta 0 unless --beta. Tunix uses its vanilla rollout (its
`Sampler` with a KV cache) on the one mesh that its actor, reference and rollout share; its remat
follows the project's pick (`full` -> Tunix's DECODER, `none` -> NONE).

The project's step is `trainer bench`'s learner (`learner.train_step()`, its own time/* phases).
Tunix's is one `GRPOLearner.train` call over a one-batch iterator; its phases are timed by a
subclass of its `RLCluster` around the calls its learner makes (generate; reference and old
log-probs; update_actor), each waiting for its arrays. After --warmup untimed steps of each leg
(the first compiles), --rounds rounds alternate one project step and one Tunix step, so both see
the same machine; `--schedule sequential` runs the project's steps, frees its arrays and then runs
Tunix's (one v5e does not hold both legs' weights, AdamW state and the project's update at once).
--remat auto is `trainer bench`'s memory pick (it compiles the plan's programs first); none/full
give it without that compile. Prints per leg the median step and phase times, the tokens
generated, the programs compiled during timed steps, and the project/Tunix step-time ratio.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from rl_core import encode_prompts
from rl_core.runtime import compile_count, use_persistent_cache
from rl_models import preset
from trainer import build
from trainer.bench.measure import bench_settings
from trainer.bench.memory_check import check_memory
from trainer.bench.presets import PRESETS

try:
    from tunix.models.qwen2 import model as tunix_qwen2
    from tunix.rl import rl_cluster as tunix_cluster
    from tunix.rl.grpo import grpo_learner as tunix_grpo
    from tunix.rl.rollout import base_rollout as tunix_rollout
except ImportError as missing:  # Tunix lives in its own folder, never in the workspace
    raise SystemExit(f"tunix_side_by_side: Tunix is not importable ({missing}); install "
                     "benchmarks/tunix-requirements.txt into a folder and put it on PYTHONPATH "
                     "(benchmarks/README.md)") from None

PHASES = ("rollout", "logprob", "update", "step")
"""Phases printed per leg: rollout, reference/old log-probs, the update, the whole step."""
REMAT = {"none": "NONE", "full": "DECODER"}
"""The project's remat -> Tunix's RematConfig (the others save some dots: the nearest is DECODER)."""


class TokenizerForTunix:
    """The project's tokenizer with the five methods Tunix's TokenizerAdapter asks of a custom one."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer

    def encode(self, text: str, **_: Any) -> list[int]:
        return self._tok.encode(text)  # Tunix's sampler puts bos_id() first, as the project's encode_prompts does

    def decode(self, ids: Any, **_: Any) -> str:
        return self._tok.decode([int(i) for i in ids])

    def bos_id(self) -> int:
        return self._tok.bos_id

    def eos_id(self) -> int:
        return self._tok.eos_ids[0]

    def pad_id(self) -> int:
        return self._tok.pad_id


class TimedCluster(tunix_cluster.RLCluster):
    """Tunix's RLCluster, timing the calls its GRPO learner makes (each waits for its arrays), and
    kept open between `train` calls (the learner closes its cluster at the end of each)."""

    def __init__(self, *, model_config: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model_config = model_config  # its rollout turns the model's remat off (remat_off)
        self.times: dict[str, float] = {}
        self.generated_tokens = 0

    def _add(self, phase: str, start: float) -> None:
        self.times[phase] = self.times.get(phase, 0.0) + time.perf_counter() - start

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        with remat_off(self.model_config):
            out = super().generate(*args, **kwargs)
        jax.block_until_ready(out.tokens)
        self._add("rollout", start)
        self.generated_tokens += sum(len(t) for t in out.tokens)
        return out

    def get_ref_per_token_logps(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = jax.block_until_ready(super().get_ref_per_token_logps(*args, **kwargs))
        self._add("logprob", start)
        return out

    def get_old_per_token_logps(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = jax.block_until_ready(super().get_old_per_token_logps(*args, **kwargs))
        self._add("logprob", start)
        return out

    def update_actor(self, *args: Any, **kwargs: Any) -> None:
        start = time.perf_counter()
        super().update_actor(*args, **kwargs)
        jax.block_until_ready(nnx.state(self.actor_trainer.model))  # the trainer keeps steps in flight
        self._add("update", start)

    def close(self) -> None:
        """Nothing: the benchmark calls `train` once a round; `finish` closes."""

    def finish(self) -> None:
        super().close()

    def take(self) -> tuple[dict[str, float], int]:
        times, tokens = self.times, self.generated_tokens
        self.times, self.generated_tokens = {}, 0
        return times, tokens


def project_settings(preset: str, *, steps: int, beta: float, remat: str, memory_gb: float | None,
                     log: Any, packing: bool = False) -> Any:
    """`trainer bench`'s settings for `preset`. remat "auto": its memory pick and check (it compiles the
    plan's programs first); "none" / "full": that remat over the whole mini-batch, with no plan (minutes
    less on a TPU). `packing`: the project's update packs its rows (training.packing)."""
    overrides = [f"algorithm.beta={beta}", f"training.packing={str(packing).lower()}"]
    if remat != "auto":
        overrides += [f"model.remat={remat}", "training.micro_batch_size=null"]
    settings = bench_settings(PRESETS[preset], steps=steps, overrides=overrides)
    return check_memory(settings, preset, memory_gb=memory_gb, log=log) if remat == "auto" else settings


def project_learner(settings: Any, task: Any, tokenizer: Any) -> Any:
    """`trainer bench`'s learner: random weights from the settings' seed, no warm start."""
    policy = build.adapted(settings, build.new_model(settings, tokenizer))
    return build.learner(settings, task, tokenizer, policy, output_dir=None, progress=False)


@contextlib.contextmanager
def remat_off(config: Any) -> Any:
    """Tunix's decoder layers wrap themselves in nnx.remat in its sampler too, where flax 0.12.8 raises
    TraceContextError ("Cannot mutate Param from a different trace level", inside the sampler's jitted decode
    loop). A forward pass keeps nothing for a backward one, so its rollout traces with no remat, as the
    project's does; the update keeps the leg's remat."""
    saved = config.remat_config
    object.__setattr__(config, "remat_config", tunix_qwen2.RematConfig.NONE)
    try:
        yield
    finally:
        object.__setattr__(config, "remat_config", saved)


def tunix_config(cfg: Any, remat: str) -> Any:
    """Tunix's Qwen2 ModelConfig of the project's TransformerConfig `cfg`."""
    return tunix_qwen2.ModelConfig(
        num_layers=cfg.num_layers, vocab_size=cfg.vocab_size, embed_dim=cfg.hidden_size,
        hidden_dim=cfg.mlp_hidden_size, num_heads=cfg.num_heads, head_dim=cfg.head_dim or cfg.hidden_size // cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads, rope_theta=int(cfg.rope_theta), norm_eps=cfg.rms_norm_eps,
        use_tied_embedding=cfg.tie_embeddings, dtype=jnp.dtype(cfg.dtype), param_dtype=jnp.dtype(cfg.param_dtype),
        remat_config=tunix_qwen2.RematConfig[REMAT.get(remat, "DECODER")],
    )


def tunix_leg(settings: Any, cfg: Any, tokenizer: Any, prompt_width: int, beta: float, seed: int,
              micro_batch: int | None = None) -> tuple[Any, Any]:
    """Tunix's GRPO learner on a one-device mesh with its vanilla rollout, and its cluster; `micro_batch`
    (prompts) accumulates the update's gradients over micro-batches, the rollout still takes all prompts."""
    prompts = settings.training.prompts_per_step
    # axes of automatic sharding, as Tunix's models expect (jax.make_mesh's default is explicit)
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("fsdp", "tp"))
    config = tunix_config(cfg, settings.model.remat)
    actor = tunix_qwen2.Qwen2(config, rngs=nnx.Rngs(seed))  # RLCluster puts it on the mesh
    reference = tunix_qwen2.Qwen2(config, rngs=nnx.Rngs(seed)) if beta else None
    new_tokens = settings.rollout.max_new_tokens
    cluster = TimedCluster(
        model_config=config, actor=actor, reference=reference, tokenizer=TokenizerForTunix(tokenizer),
        cluster_config=tunix_cluster.ClusterConfig(
            role_to_mesh={role: mesh for role in (tunix_cluster.Role.ACTOR, tunix_cluster.Role.REFERENCE,
                                                  tunix_cluster.Role.ROLLOUT)},
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=tunix_cluster.RLTrainingConfig(
                actor_optimizer=optax.adamw(settings.training.learning_rate, weight_decay=settings.training.weight_decay),
                eval_every_n_steps=10**9,
                max_steps=10**9, pbar_description=None,
                mini_batch_size=prompts if micro_batch else None, train_micro_batch_size=micro_batch,
                rollout_micro_batch_size=prompts, compute_logps_micro_batch_size=prompts),
            rollout_config=tunix_rollout.RolloutConfig(
                max_tokens_to_generate=new_tokens, max_prompt_length=prompt_width, kv_cache_size=prompt_width + new_tokens,
                temperature=settings.rollout.temperature, top_p=1.0, top_k=None),
        ),
    )
    learner = tunix_grpo.GRPOLearner(
        rl_cluster=cluster, reward_fns=[answer_reward],
        algo_config=tunix_grpo.GRPOConfig(num_generations=settings.algorithm["group_size"], num_iterations=1, beta=beta),
    )
    return learner, cluster


def answer_reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """1 where the completion starts with the answer (the addition task's check, on Tunix's side)."""
    return [float(c.strip().startswith(str(a))) for c, a in zip(completions, answer, strict=True)]


def tunix_step(learner: Any, batch: dict[str, np.ndarray], cluster: TimedCluster) -> dict[str, float]:
    """One Tunix GRPO step (one `train` call over one batch) and its phases in seconds."""
    start = time.perf_counter()
    learner.train(iter([dict(batch)]))
    step = time.perf_counter() - start
    times, tokens = cluster.take()
    return {"rollout": times.get("rollout", 0.0), "logprob": times.get("logprob", 0.0),
            "update": times.get("update", 0.0), "step": step, "generated_tokens": tokens}


def project_step(learner: Any, rows: int) -> dict[str, float]:
    """One project GRPO step of `rows` completions and its phases (the learner's own time/* records) in seconds."""
    record = learner.train_step()
    return {"rollout": record.get("time/rollout", 0.0), "logprob": record.get("time/logprob", 0.0),
            "update": record.get("time/update", 0.0), "step": record["time/step"],
            "generated_tokens": record["completions/length_mean"] * rows}


def medians(steps: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(s[k] for s in steps) for k in steps[0]}


def warm(leg: str, step: Any, count: int) -> None:
    for i in range(count):
        start = time.perf_counter()
        step()
        print(f"warm-up {leg} {i + 1}: {time.perf_counter() - start:.2f} s (the first compiles)")


def counted(step: Any) -> dict[str, float]:
    """One step's phases, with the programs compiled during it (0 once warm: a recompile shows here)."""
    before = compile_count()
    out = step()
    return out | {"compiles": compile_count() - before}


def seconds(steps: list[dict[str, float]]) -> str:
    return ", ".join(f"{s['step']:.3f}" for s in steps)


def live_device_bytes() -> int:
    return sum(a.nbytes for a in jax.live_arrays())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny-qwen2", choices=("tiny-qwen2", "qwen2.5-0.5b-shape"))
    ap.add_argument("--rounds", type=int, default=3, help="timed steps of each leg")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps of each leg first (the first compiles)")
    ap.add_argument("--schedule", default="alternate", choices=("alternate", "sequential"),
                    help="alternate: both legs built, one step of each a round; sequential: the project's steps, "
                         "its arrays freed, then Tunix's (where both legs' weights, AdamW state and the update "
                         "do not fit one device together)")
    ap.add_argument("--only", default=None, choices=("project", "tunix"),
                    help="one leg alone (sequential schedule): for a host where the pair would not finish in one call")
    ap.add_argument("--remat", default="auto", choices=("auto", "none", "full"),
                    help="the project's remat (Tunix's follows); auto: trainer bench's memory pick")
    ap.add_argument("--packing", action="store_true",
                    help="the project's update packs its rows (training.packing; Tunix has no packing)")
    ap.add_argument("--tunix-micro-batch", type=int, default=None,
                    help="prompts per micro-batch of Tunix's update (gradients accumulated; default: all of them), "
                         "should its update not fit")
    ap.add_argument("--memory-gb", type=float, default=None, help="GiB the project's memory pick may plan for")
    ap.add_argument("--beta", type=float, default=0.0, help="KL coefficient (non-zero adds the reference pass)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--against", type=Path, default=None,
                    help="an earlier --only run's JSON (--out): its leg joins this run's in the table and the ratio")
    ap.add_argument("--compile-cache", type=Path, default=None,
                    help="keep both legs' compiled programs here: a second call on the same host loads them")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if args.only and args.schedule != "sequential":
        ap.error("--only runs one leg: it needs --schedule sequential")
    if args.compile_cache:
        use_persistent_cache(args.compile_cache)

    import tunix  # noqa: PLC0415 (imported above; its version for the record)

    print(f"devices: {jax.devices()}; jax {jax.__version__}, tunix {tunix.__version__}")
    settings = project_settings(args.preset, steps=args.warmup + args.rounds + 1, beta=args.beta, remat=args.remat,
                                memory_gb=args.memory_gb, log=print, packing=args.packing)
    task, tokenizer = settings.task.build(), build.tokenizer(settings)
    cfg = preset(settings.model.preset, vocab_size=tokenizer.vocab_size, **settings.model.runtime())
    prompts = task.train[: settings.training.prompts_per_step]
    width = encode_prompts(tokenizer, [p.text for p in prompts], max_tokens=settings.rollout.max_prompt_tokens)[0].shape[1]
    batch = {"prompts": np.array([p.text for p in prompts]),
             "answer": np.array([str(p.fields.get("answer", "")) for p in prompts])}
    learner = project_learner(settings, task, tokenizer) if args.only != "tunix" else None
    rows = settings.training.prompts_per_step * settings.algorithm["group_size"]
    print(f"{args.preset}: {settings.training.prompts_per_step} prompts x {settings.algorithm['group_size']} samples, "
          f"prompt width {width}, up to {settings.rollout.max_new_tokens} new tokens, {settings.model.dtype} "
          f"compute, remat {settings.model.remat} (Tunix {REMAT.get(settings.model.remat, 'DECODER')}), "
          f"{'packed' if settings.training.packing else 'unpacked'}, beta "
          f"{args.beta}, {args.schedule}")

    def project() -> dict[str, float]:
        return project_step(learner, rows)

    def new_tunix() -> tuple[Any, TimedCluster]:
        tunix_learner, cluster = tunix_leg(settings, cfg, tokenizer, width, args.beta, settings.model.seed,
                                           args.tunix_micro_batch)
        return (lambda: tunix_step(tunix_learner, batch, cluster)), cluster

    timed: dict[str, list[dict[str, float]]] = {"project": [], "tunix": []}
    if args.schedule == "alternate":
        tunix_leg_step, cluster = new_tunix()
        warm("project", project, args.warmup)
        warm("tunix", tunix_leg_step, args.warmup)
        for r in range(args.rounds):
            timed["project"].append(counted(project))
            timed["tunix"].append(counted(tunix_leg_step))
            print(f"round {r + 1}: project {timed['project'][-1]['step']:.3f} s, tunix {timed['tunix'][-1]['step']:.3f} s")
    else:
        if args.only != "tunix":
            warm("project", project, args.warmup)
            timed["project"] = [counted(project) for _ in range(args.rounds)]
            print(f"project steps: {seconds(timed['project'])} s", flush=True)
        before = live_device_bytes()
        del learner, project  # the project's weights, AdamW state and caches go before Tunix's arrive
        gc.collect()
        jax.clear_caches()  # and its compiled programs, with any array they hold
        print(f"project freed: live arrays {before / 2**30:.2f} -> {live_device_bytes() / 2**30:.2f} GiB")
        if args.only != "project":
            tunix_leg_step, cluster = new_tunix()
            warm("tunix", tunix_leg_step, args.warmup)
            timed["tunix"] = [counted(tunix_leg_step) for _ in range(args.rounds)]
            print(f"tunix steps: {seconds(timed['tunix'])} s", flush=True)
            cluster.finish()
    if args.schedule == "alternate":
        cluster.finish()
    timed = {leg: steps for leg, steps in timed.items() if steps}
    if args.against:  # the other leg, from an earlier call (e.g. on a chip where one call holds one leg)
        earlier = json.loads(args.against.read_text())
        if earlier["preset"] != args.preset:
            raise SystemExit(f"--against {args.against}: its preset is {earlier['preset']}, this run's {args.preset}")
        timed = {leg: earlier["steps"][leg] for leg in earlier["steps"] if leg not in timed} | timed
        print(f"from {args.against}: {', '.join(leg for leg in earlier['steps'] if leg in timed)}")

    results = {leg: medians(steps) for leg, steps in timed.items()}
    print(f"\nmedian of each leg's timed steps ({', '.join(f'{leg} {len(t)}' for leg, t in timed.items())}), "
          f"seconds ({rows} rows):")
    print(f"| leg | {' | '.join(PHASES)} | generated tokens | compiles in timed steps |")
    print(f"|---|{'---:|' * (len(PHASES) + 2)}")
    for leg, m in results.items():
        print(f"| {leg} | {' | '.join(f'{m[p]:.3f}' for p in PHASES)} | {m['generated_tokens']:.0f} | "
              f"{sum(s['compiles'] for s in timed[leg])} |")
    ratio = results["project"]["step"] / results["tunix"]["step"] if len(results) == 2 else None
    if ratio is not None:
        print(f"step-time ratio project/Tunix: {ratio:.2f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"preset": args.preset, "schedule": args.schedule, "steps": timed,
                                        "medians": results, "ratio": ratio, "tunix": tunix.__version__,
                                        "jax": jax.__version__, "devices": str(jax.devices())}, indent=1) + "\n")


if __name__ == "__main__":
    main()
