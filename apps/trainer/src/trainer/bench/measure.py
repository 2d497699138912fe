"""`trainer bench`: rollout and train-step speed, compile count and model-FLOPs utilisation.

1. The machine's float32 matmul peak: jitted n x n @ n x n matmuls (2 n^3
   FLOPs each) of a few sizes up to a large one, each the best of several
   timed runs, measured before the steps and again after them; the peak is
   the best rate seen. (On a small shared CPU a single large matmul often
   runs well below what mid-sized ones reach, and a phase must not beat the
   "peak"; taking the best makes every utilisation figure conservative.)
2. A learner built the way `trainer train` builds one (random initial weights,
   no warm start), run for warm-up steps (the first compiles) and then timed
   steps, with the compile count read after the first step, before the timed
   steps and after them: it must stay flat after the first step.
3. Each step's phases as the learner times them (time/rollout, time/reward,
   time/logprob, time/update, time/step) and each phase's FLOPs, counted
   analytically from the tokens it actually processed: model FLOPs (MFU's
   numerator: what the task costs the model) and needed FLOPs (what this
   implementation runs of them; see trainer.bench.flops).
4. Prefill and decode time: the rollout program timed against the same program
   with max_new_tokens=1 (prefill plus the first sampled token). Each prompt is
   prefilled once for its whole group.

Model FLOPs: trainer.bench.flops; presets: trainer.bench.presets; the results record and its table:
trainer.bench.summary.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from rl_core.runtime import compile_count, compile_seconds, mesh as mesh_lib
from rl_core import ConfigError, Sampler, SamplingParams
from rl_core.rollout import resolve_engine
from rl_models import TransformerConfig

from trainer import build
from trainer.bench.critic import CRITIC, critic_config, critic_flops, critic_memory, split
from trainer.bench.critic import PHASE as CRITIC_PHASE
from trainer.bench.flops import (
    matmul_peak,
    memory_rate,
    decode_floor_bytes,
    merge_peaks,
    prefill_flops,
    sampling_flops,
    scoring_flops,
    timed,
    training_flops,
)
from trainer.bench.memory_check import check_memory
from trainer.bench.presets import PRESETS, BenchPreset
from trainer.bench.summary import PHASES, print_table, summarise
from trainer.bench.trace import profiled
from trainer.run import devices, plural
from trainer.settings import build_settings


class _Recorder:
    """Counts the real tokens each model phase processes: the learner's meter (rl_core.learner.meter),
    told the rows of every generation, scoring pass, trained batch and update."""

    def __init__(self, cfg: TransformerConfig) -> None:
        self.cfg, self.learner, self.critic = cfg, None, None
        self.flops = {"rollout": 0.0, "logprob": 0.0, "update": 0.0}  # model FLOPs (bench_flops)
        self.needed = dict(self.flops)  # needed FLOPs
        self.tokens = {"prompt": 0, "generated": 0, "trained": 0}

    def watch(self, learner: Any) -> None:
        """Count for `learner` (its layout shares prompts; a critic (PPO) is a phase of its own)."""
        self.learner = learner
        if CRITIC in learner.models:
            self.critic = critic_config(learner)
            self.flops[CRITIC_PHASE] = self.needed[CRITIC_PHASE] = 0.0

    def _add(self, phase: str, model: float, needed: float) -> None:
        self.flops[phase] += model
        self.needed[phase] += needed

    def _shared_group(self, example: Any) -> int:
        return self.learner.layout.rows_per_prompt(example.prompt_tokens, example.prompt_mask)

    def generated(self, prompt_mask: Any, lengths: Any, num_samples: int) -> None:
        cfg = self.cfg
        prompt = np.asarray(prompt_mask).sum(axis=1)
        lengths = np.asarray(lengths)  # the learner fetches these anyway
        self._add("rollout", sampling_flops(cfg, prompt, lengths, num_samples, needed=False),
                  sampling_flops(cfg, prompt, lengths, num_samples))
        self.tokens["prompt"] += int(prompt.sum())
        self.tokens["generated"] += int(lengths.sum())

    def scored(self, model: str, example: Any) -> None:
        if model == CRITIC:  # its values pass at collection time, in the log-prob phase where it is timed
            self._add("logprob", *critic_flops(self.critic, example, passes=1))
            return
        prompt, completion = example_tokens(example)
        self._add("logprob", scoring_flops(self.cfg, prompt, completion, needed=False),
                  scoring_flops(self.cfg, prompt, completion, self._shared_group(example)))

    def trained(self, example: Any, passes: int) -> None:
        prompt, completion = example_tokens(example)
        self._add("update", passes * training_flops(self.cfg, prompt, completion, needed=False),
                  passes * training_flops(self.cfg, prompt, completion, self._shared_group(example)))
        self.tokens["trained"] += int(passes * (prompt + completion).sum())

    def updated(self, model: str, batch: Any) -> None:
        if model == CRITIC:  # forward and backward
            self._add(CRITIC_PHASE, *critic_flops(self.critic, batch, passes=3))

    def take(self) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
        """(model FLOPs, needed FLOPs, tokens) by phase since the last take."""
        flops, needed, tokens = dict(self.flops), dict(self.needed), dict(self.tokens)
        self.flops, self.needed = dict.fromkeys(self.flops, 0.0), dict.fromkeys(self.needed, 0.0)
        self.tokens = dict.fromkeys(self.tokens, 0)
        return flops, needed, tokens


def example_tokens(example: Any) -> tuple[np.ndarray, np.ndarray]:
    """Real prompt tokens and loss-masked completion tokens per row."""
    return np.asarray(example.prompt_mask).sum(axis=1), np.asarray(example.completion_mask).sum(axis=1)


def architecture(cfg: TransformerConfig) -> str:
    """The model's shape in the words of the presets' descriptions."""
    parts = [
        f"hidden {cfg.hidden_size}",
        f"{cfg.num_layers} layers",
        f"{cfg.num_heads} heads",
        f"{cfg.num_kv_heads} KV heads",
        f"MLP {cfg.mlp_hidden_size}",
        "tied embeddings" if cfg.tie_embeddings else "untied embeddings",
        f"vocabulary {cfg.vocab_size}",
    ]
    return ", ".join(parts)


def bench_settings(p: BenchPreset, *, steps: int, algo: str = "grpo", model: str | None = None,
                   overrides: Sequence[str] = ()) -> Any:
    """The run settings of preset `p` for `steps` steps: random initial weights (no warm start), AdamW, beta 0."""
    return build_settings(
        algo=algo,
        overrides=[
            f"task.options.digits={p.digits}",
            f"model.path={model}" if model else f"model.preset={p.model}",
            f"model.dtype={p.dtype}",
            "warm_start.steps=0",
            f"rollout.max_new_tokens={p.max_new_tokens}",
            "rollout.temperature=1.0",
            f"training.prompts_per_step={p.prompts}",
            f"training.num_steps={steps}",
            "training.optimizer=adamw",
            "training.learning_rate=1e-5",
            "training.checkpoint_every_steps=0",
            f"algorithm.group_size={p.group_size}",
            "algorithm.beta=0.0",
            "eval.every_steps=0",
            *overrides,
        ],
    )


BENCH_OVERRIDES = ("model.", "rollout.engine=", "training.packing=", "training.share_prompts=",
                   "training.micro_batch_size=")
"""What a bench may change: the model and its memory settings, the engine, how the update lays out its rows
(packing, each group's prompt once); not the batch or the algorithm."""


def run_bench(
    *,
    preset: str = "tiny-qwen2",
    steps: int = 10,
    output: Path | None = None,
    algo: str = "grpo",
    model: str | None = None,
    overrides: Sequence[str] = (),
    memory_gb: float | None = None,
    profile: Path | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the benchmark; print a table, write JSON to `output` (if given) and return the results.

    `model` (a local Hugging Face folder) replaces the preset's model and
    tokenizer with a real architecture; the batch shape stays the preset's.
    `overrides` (dotted settings, last) may make it a LoRA run (`model.lora.rank=8`), pick the
    rollout engine, pack the update's rows (`training.packing=true`) or set its micro-batch
    (`training.micro_batch_size=16`, with `model.remat` the memory settings a run picks when left
    at auto); `profile` traces the timed steps.
    """
    if any(not o.startswith(BENCH_OVERRIDES) for o in overrides):
        raise ConfigError(f"bench overrides {list(overrides)}: only model.* settings (e.g. model.lora.rank=8), "
                          "rollout.engine, training.packing, training.share_prompts and training.micro_batch_size")
    if preset not in PRESETS:
        raise ConfigError(f"--preset {preset!r}: unknown; presets are {', '.join(sorted(PRESETS))}")
    if steps < 1:
        raise ConfigError(f"--steps {steps}: must be >= 1")
    p = PRESETS[preset]
    if p.needs_model and not model:
        raise ConfigError(f"--preset {preset} needs --model DIR, the model's Hugging Face folder (for SmolLM2: "
                          "uv run trainer convert --gguf FILE --out DIR; docs/real-models.md)")
    settings = bench_settings(p, steps=p.warmup_steps + steps, algo=algo, model=model, overrides=overrides)
    log(f"bench {preset}: {devices.describe()}")
    seconds_start = compile_seconds()
    settings = check_memory(settings, preset, memory_gb=memory_gb, log=log)  # picks remat=auto; before anything is allocated
    seconds_checked = compile_seconds()
    task = settings.task.build()
    tokenizer = build.tokenizer(settings)
    policy = build.new_model(settings, tokenizer)
    cfg = policy.config
    # with --model the preset gives only the batch shape: describe the model actually loaded
    description = (
        f"{model}: {architecture(cfg)}; {p.prompts} prompts x {p.group_size} completions, "
        f"up to {p.max_new_tokens} new tokens"
        if model
        else p.description
    )
    log(f"bench {preset} ({algo}): {description}")
    if model:
        log(f"model: {model} ({type(tokenizer).__name__}, vocabulary {tokenizer.vocab_size})")
    policy = build.adapted(settings, policy)
    recorder = _Recorder(cfg)
    learner = build.learner(settings, task, tokenizer, policy, output_dir=None, progress=False, meter=recorder)
    recorder.watch(learner)
    memory = resident_memory(learner)
    log(f"trainable parameters {memory['trainable_parameters']:,}; per device: trained {memory['trained_bytes']:,} B, "
        f"optimizer state {memory['optimizer_state_bytes']:,} B, frozen base {memory['frozen_bytes']:,} B")
    # a critic (PPO): its update is timed as a phase of its own (trainer.bench.critic)
    critic = CRITIC in learner.models
    phases = (*PHASES, CRITIC_PHASE) if critic else PHASES
    if critic:
        memory |= critic_memory(learner)
        log(f"critic: {memory['critic_trainable_parameters']:,} trained parameters; per device: trained "
            f"{memory['critic_trained_bytes']:,} B, optimizer state {memory['critic_optimizer_state_bytes']:,} B")

    sizes = ", ".join(f"{n}^2" for n in p.matmul_sizes)
    log(f"measuring the float32 matmul peak ({sizes}; again after the steps)")
    peak_before = matmul_peak(p.matmul_sizes, p.matmul_repeats, p.matmul_min_seconds)

    log(f"{plural(p.warmup_steps, 'warm-up step')}, then {steps} timed")
    compiles_start, seconds_before_steps = compile_count(), compile_seconds()
    learner.train_step()
    compiles_first, seconds_first = compile_count(), compile_seconds()
    for _ in range(p.warmup_steps - 1):
        learner.train_step()
    recorder.take()
    compiles_before = compile_count()
    records = []
    wall = 0.0
    with profiled(profile):  # --profile DIR: a jax.profiler trace of the timed steps (trainer.bench.trace)
        for _ in range(steps):
            start = time.perf_counter()
            record = learner.train_step()
            wall += time.perf_counter() - start
            records.append(split(record) if critic else record)
    compiles_after = compile_count()
    flops, needed, tokens = recorder.take()

    prefill, decode = _prefill_decode(learner, task, p)
    peak = merge_peaks(peak_before, matmul_peak(p.matmul_sizes, p.matmul_repeats, p.matmul_min_seconds))
    bandwidth = memory_rate()
    decode["memory_bytes_per_sec"] = bandwidth
    decode["floor_seconds_per_iteration"] = decode["floor_bytes_per_iteration"] / bandwidth
    seconds_end = compile_seconds()
    results = summarise(
        preset=preset,
        description=description,
        algo=algo,
        p=p,
        cfg=cfg,
        peak=peak,
        records=records,
        flops=flops,
        needed=needed,
        tokens=tokens,
        wall=wall,
        model=model,
        compiles={
            "first_step": compiles_first - compiles_start,
            "warmup": compiles_before - compiles_start,
            "after_first_step": compiles_after - compiles_first,
            "timed_delta": compiles_after - compiles_before,
            # XLA's seconds compiling (or loading from the cache): the memory check's plan, the first step
            "memory_check_seconds": seconds_checked - seconds_start,
            "first_step_seconds": seconds_first - seconds_before_steps,
            # and in all, the bench's own programs included (the prefill-only sampler, the matmul peaks)
            "total_seconds": seconds_end - seconds_start,
        },
        prefill=prefill,
        decode=decode,
        phase_names=phases,
    )
    lora = settings.model.lora
    results["lora"] = {"rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets),
                       "quantize": settings.model.quantize} if lora.rank else None
    results["memory"] = memory | device_peak(settings)
    if results["memory"]["device_peak_bytes"]:
        log(f"device memory: peak {results['memory']['device_peak_bytes'] / 2**30:.2f} GiB in use (the allocator's; "
            "on a TPU without the programs' temporaries), "
            f"remat={settings.model.remat}, micro_batch_size={settings.training.micro_batch_size}")
    results["rollout"]["engine"] = resolve_engine(settings.rollout)  # "auto" picks by max_new_tokens
    print_table(results)
    if output is not None:
        output = Path(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n")
        log(f"wrote {output}")
    return results


def _prefill_decode(learner: Any, task: Any, p: BenchPreset) -> tuple[dict[str, float], dict[str, float]]:
    """Best times of the rollout program and of its prefill-only twin on one fixed batch."""
    prompts = task.train[: p.prompts]
    tokens, mask = learner.generator.encode(prompts)
    prefill_sampler = Sampler(
        learner.policy.graphdef, max_new_tokens=1, eos_ids=learner.tokenizer.eos_ids, pad_id=learner.tokenizer.pad_id,
        mesh=learner.layout.mesh, param_shardings=learner.policy.shardings,
    )
    rows = mesh_lib.rows(learner.layout.mesh)  # the input layout of the rollout
    tokens_d, mask_d = jax.device_put(tokens, rows), jax.device_put(mask, rows)
    sampling = SamplingParams.from_rollout(learner.rollout)
    key = jax.random.PRNGKey(1)
    n = p.group_size

    def run_full():
        return jax.block_until_ready(learner.generator.sampler(learner.policy_params(), tokens_d, mask_d, key, sampling, n))

    def run_prefill():
        return jax.block_until_ready(prefill_sampler(learner.policy_params(), tokens_d, mask_d, key, sampling, n))

    out = run_full()
    run_prefill()
    full = min(timed(run_full) for _ in range(p.generate_repeats))
    first = min(timed(run_prefill) for _ in range(p.generate_repeats))
    lengths = np.asarray(out.lengths)
    prompt = mask.sum(axis=1)
    model_cfg = learner.model.config
    prefill = {"flops": prefill_flops(model_cfg, prompt, needed=False), "needed_flops": prefill_flops(model_cfg, prompt)}
    decode_flops = sampling_flops(model_cfg, prompt, lengths, n) - prefill["needed_flops"]  # the same in both counts
    steps = int(lengths.max()) - 1  # decode iterations of the while loop after the prefill's token
    decode_seconds = max(full - first, 0.0)
    floor_bytes = decode_floor_bytes(model_cfg, len(tokens) * n, tokens.shape[1], steps)
    return (
        {"seconds": first, "tokens": float(prompt.sum()), **prefill},
        {
            "seconds": decode_seconds,
            "iterations": float(steps),
            "seconds_per_iteration": decode_seconds / steps if steps > 0 else 0.0,
            "generated_tokens": float(lengths.sum()),
            "full_generate_seconds": full,
            "tokens_per_sec": float(lengths.sum()) / full,
            "flops": decode_flops,
            "needed_flops": decode_flops,
            "floor_bytes_per_iteration": floor_bytes,
        },
    )


def device_peak(settings: Any) -> dict[str, Any]:
    """The allocator's peak bytes in use on device 0 so far (an accelerator's; none on CPU), beside the
    memory settings the run took (model.remat=auto picked: trainer.plan.choice). On a TPU it leaves out
    each program's temporaries (a program of 13 GiB of them left it at 1.01 GiB): the resident state and
    the programs' arguments and outputs, to set beside `trainer plan`'s resident figure, not its peak."""
    stats = jax.devices()[0].memory_stats() or {}
    return {"device_peak_bytes": stats.get("peak_bytes_in_use"), "remat": settings.model.remat,
            "micro_batch_size": settings.training.micro_batch_size}


def resident_memory(learner: Any) -> dict[str, int]:
    """Trainable parameter count and the bytes each device holds of the trained parameters,
    their optimizer state and the frozen base (a LoRA run's adapters vs its base)."""

    def per_device(tree: Any) -> int:
        return sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(tree) if hasattr(x, "addressable_shards"))

    return {
        "trainable_parameters": sum(int(x.size) for x in jax.tree.leaves(learner.params)),
        "trained_bytes": per_device(learner.params),
        "optimizer_state_bytes": per_device(learner.state.policy.opt_state),
        "frozen_bytes": per_device(learner.policy.frozen),
    }
