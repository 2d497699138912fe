"""What model.remat=auto and training.micro_batch_size=auto (the defaults) pick: the largest
micro-batch and, at it, the least recomputation that fits the device (the whole mini-batch at
remat=full comes before remat=none in halves; which is faster on a TPU is not measured yet).

The candidates are trainer.plan.search's training side, in its order: at the whole mini-batch,
remat none, dots_saveable, dots_with_no_batch_dims_saveable, full; then the same at each halved
micro-batch. A field the user set is kept (only the other one varies; with both set, nothing is
picked and the count only warns). Each candidate is first counted from the model's shape
(trainer.plan.estimate: nothing compiled); a count far under or far over the limit settles it, and
only one in between is compiled (trainer.plan.planner, on this backend: on a TPU its compiler
refuses what does not fit, trainer.plan.refusal). So a small CPU run (`trainer compare`'s tiny
model) picks remat none and the whole mini-batch at once, as runs did before "auto", and a
Qwen2.5-0.5B-shape step on a v5e compiles only the candidate the count cannot settle.

The pick is one line (`Choice.line`), logged by `trainer train` and `trainer bench` when a run starts
and printed by `trainer plan`; the run's config.yaml holds the values picked, so a resume keeps them.
Only the policy's training side is counted and compiled: a critic (PPO), a distillation teacher or a
judge model is not (`trainer plan`'s table shows them), and neither is the rollout engine, which no
remat or micro-batch changes. Weights, optimizer state and gradients that are over the device alone
stop the run at once (`NothingFits`), naming LoRA and FSDP.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from rl_core import MICRO_AUTO, ConfigError

from trainer.plan import estimate
from trainer.plan.device_memory import GIB
from trainer.plan.refusal import ProgramRefused
from trainer.plan.search import REMAT_ORDER, micro_batches
from trainer.settings.schemas import REMAT_AUTO

TRAINING_PROGRAMS = ("update", "reference", "critic_update", "critic_values")


class NothingFits(ConfigError):
    """No candidate fits; `last` is the one that keeps the least (remat full, the smallest micro-batch)."""

    def __init__(self, message: str, last: "Candidate") -> None:
        super().__init__(message)
        self.last = last


@dataclasses.dataclass(frozen=True)
class Candidate:
    remat: str
    micro_batch_size: int | None
    """None: the whole mini-batch (what the run's config then says)."""

    def describe(self) -> str:
        micro = "the whole mini-batch" if self.micro_batch_size is None else f"{self.micro_batch_size} rows"
        return f"remat={self.remat}, micro-batch {micro}"


@dataclasses.dataclass(frozen=True)
class Choice:
    """The remat and micro-batch a run takes, and why."""

    picked: Candidate
    why: str
    auto: tuple[str, ...]
    """The settings that were "auto" (empty: the user set both)."""

    def line(self) -> str:
        micro = self.picked.micro_batch_size
        micro_text = "whole mini-batch" if micro is None else str(micro)
        what = "picked" if self.auto else "as set"
        return f"memory: remat={self.picked.remat}, micro_batch_size={micro_text} ({what}: {self.why})"

    def apply(self, settings: Any) -> Any:
        """`settings` with the picked values in place of "auto"."""
        model = dataclasses.replace(settings.model, remat=self.picked.remat)
        training = dataclasses.replace(settings.training, micro_batch_size=self.picked.micro_batch_size)
        return dataclasses.replace(settings, model=model, training=training)

    def overrides(self) -> tuple[str, ...]:
        """The picked values as dotted overrides (for settings built again from the command line)."""
        micro = self.picked.micro_batch_size
        return (f"model.remat={self.picked.remat}", f"training.micro_batch_size={'null' if micro is None else micro}")


def auto_settings(settings: Any) -> tuple[str, ...]:
    """The dotted names of the memory settings left at "auto"."""
    return tuple(name for name, auto in (("model.remat", settings.model.remat == REMAT_AUTO),
                                         ("training.micro_batch_size",
                                          settings.training.micro_batch_size == MICRO_AUTO)) if auto)


def candidates(settings: Any) -> list[Candidate]:
    """The candidates in order (module doc); a setting the user gave is the only value of its own."""
    model, training = settings.model, settings.training
    remats = REMAT_ORDER if model.remat == REMAT_AUTO else (model.remat,)
    if training.micro_batch_size == MICRO_AUTO:
        micros: list[int | None] = [None, *micro_batches(settings)[1:]]  # the first is the whole mini-batch
    else:
        micros = [training.micro_batch_size]
    return [Candidate(remat, micro) for micro in micros for remat in remats]


def decide(options: Sequence[Candidate], count: Callable[[Candidate], int],
           compiled: Callable[[Candidate], int | None], limit: int,
           log: Callable[[str], None] = lambda _: None) -> tuple[Candidate, str] | None:
    """The first of `options` that fits `limit` bytes, and why the first and last before it did not (or why it
    fits); None when none does. `count` is the quick count (trainer.plan.estimate); `compiled` the
    compiled plan's training peak, or None when the compiler refused the program, asked only where
    the count does not settle it."""
    first_miss = last_miss = None
    for option in options:
        counted = count(option)
        verdict = estimate.settled(counted, limit)
        if verdict is None:
            peak = compiled(option)
            fits = peak is not None and peak <= limit
            how = ("refused by the compiler" if peak is None else f"needs {peak / GIB:.1f} GiB") + \
                  f" (counted {counted / GIB:.1f})"
        else:
            fits, how = verdict, f"counted {counted / GIB:.1f} GiB"
        log(f"  {option.describe()}: {how} of {limit / GIB:.1f} -> {'fits' if fits else 'too much'}")
        if fits:  # why: the first candidate passed over and, when another, the last
            misses = [m for m in (first_miss, last_miss) if m]
            if misses:
                return option, "passed over " + "; ".join(dict.fromkeys(misses))
            return option, f"{how} of {limit / GIB:.1f}"
        last_miss = f"{option.describe()} {how} of {limit / GIB:.1f}"
        first_miss = first_miss or last_miss
    return None


def plan_training_peak(plan: Any) -> int:
    """A compiled plan's (trainer.plan.result.Plan) resident state plus its largest training program:
    what `trainer.plan.planner.training_peak` compiles alone."""
    return plan.resident_bytes + max(plan.program_bytes[n] for n in TRAINING_PROGRAMS if n in plan.program_bytes)


def choose(settings: Any, limit: int, peak_of: Callable[[Any], int], platform: str,
           log: Callable[[str], None] = lambda _: None, warn: Callable[[str], None] = print,
           shape_of: Callable[[Any, Candidate], estimate.Shape] | None = None) -> Choice:
    """The remat and micro-batch of a run with `settings` on a `platform` device under `limit` bytes;
    `peak_of(settings)` compiles its training programs (trainer.plan.planner.training_peak, or
    `plan_training_peak` of a whole plan) and may raise ProgramRefused. `log` gets a
    line per candidate tried; `warn` the line for settings the user gave that surely do not fit. Raises
    ConfigError when nothing searched fits (the line names what to change)."""
    auto = auto_settings(settings)
    shape_of = shape_of or model_shape(settings, platform)
    options = candidates(settings)

    def count(c: Candidate) -> int:
        return estimate.training_bytes(shape_of(settings, c), c.remat)

    def compiled(c: Candidate) -> int | None:
        try:
            return peak_of(Choice(c, "", auto).apply(settings))
        except ProgramRefused:
            return None

    if not auto:  # the user's settings win: only a count that is surely too much is said
        c = options[0]
        counted = count(c)
        if estimate.settled(counted, limit) is False:
            warn(f"memory: {c.describe()} as set counts {counted / GIB:.1f} GiB per device, over the "
                f"{limit / GIB:.1f} GiB this device has; `trainer plan` says more, or leave model.remat and "
                "training.micro_batch_size at auto")
        return Choice(c, f"counted {counted / GIB:.1f} GiB of {limit / GIB:.1f}", auto)
    first = shape_of(settings, options[0])
    floor = estimate.resident_bytes(first) + 4 * first.trainable
    if floor > limit:  # no remat or micro-batch changes the weights, the optimizer state or the gradients
        raise NothingFits(f"memory: the float32 weights, AdamW state and gradients alone take {floor / GIB:.1f} GiB "
                          f"per device, over the {limit / GIB:.1f} this device has: train adapters "
                          "(model.lora.rank=16) or spread them over more devices (training.mesh.fsdp)", options[-1])
    found = decide(options, count, compiled, limit, log)
    if found is None:
        raise NothingFits(f"memory: no remat and micro-batch fits {limit / GIB:.1f} GiB per device "
                          f"(the last tried, {options[-1].describe()}, does not); spread the model over more devices "
                          "(training.mesh.fsdp), train adapters (model.lora.rank) or shorten rollout.max_new_tokens",
                          options[-1])
    return Choice(found[0], found[1], auto)


def model_shape(settings: Any, platform: str) -> Callable[[Any, Candidate], estimate.Shape]:
    """`shape_of(settings, candidate)` for a run's model on a `platform` device: its parameters counted
    once (`nnx.eval_shape`, nothing allocated), the batch per candidate."""
    import jax
    import numpy as np
    from flax import nnx
    from rl_core.policy import frozen as frozen_lib
    from rl_models import attention as attention_lib
    from rl_models import model_class
    from rl_models.lora import add_adapters
    from rl_models.transformer import compute_dtype

    from trainer.plan.planner import planned_config

    m, training = settings.model, settings.training
    config, _ = planned_config(m)
    lora = m.lora

    def build():
        model = model_class(config)(config, rngs=nnx.Rngs(0))
        return add_adapters(model, rank=lora.rank, alpha=lora.alpha, targets=lora.targets) if lora.rank else model

    _, trained, frozen, _ = frozen_lib.split_policy(nnx.eval_shape(build))
    size = lambda tree: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))  # noqa: E731
    trainable, base = size(trained), size(frozen)
    devices = jax.device_count() - training.rollout_devices
    data, fsdp, expert, tensor = training.mesh.shape(devices)
    shards, rows_ways = fsdp * tensor * expert, data * fsdp * expert
    algo = settings.algorithm_config()
    batch = training.prompts_per_step * algo.group_size
    whole = batch // training.batch_layout(batch)[0]
    seq = settings.rollout.max_prompt_tokens + settings.rollout.max_new_tokens  # BOS included (programs.py)
    fused = attention_lib.resolve(config.attention, dtype=compute_dtype(config), head_dim=config.head_dim,
                                  platform=platform, length=seq) != "xla"
    itemsize = lambda name: np.dtype(name).itemsize if name != "bfloat16" else 2  # noqa: E731

    def shape_of(_: Any, c: Candidate) -> estimate.Shape:
        micro = whole if c.micro_batch_size is None else c.micro_batch_size
        return estimate.Shape(
            parameters=(trainable + base) // shards, trainable=trainable // shards, layers=config.num_layers,
            hidden=config.hidden_size, mlp_hidden=config.mlp_hidden_size // tensor,
            heads=max(config.num_heads // tensor, 1), vocab=config.vocab_size, rows=max(micro // rows_ways, 1),
            seq=seq,
            chunk_tokens=settings.rollout.logprob_chunk_tokens, compute_bytes=itemsize(config.dtype),
            param_bytes=itemsize(config.param_dtype), fused_attention=fused, frozen_base=bool(lora.rank),
            reference=bool(algo.beta) and not lora.rank)

    return shape_of


def pick_memory(settings: Any, limit: int, peak_of: Callable[[Any], int], platform: str,
                log: Callable[[str], None] = print,
                detail: Callable[[str], None] = lambda _: None) -> tuple[Any, Choice]:
    """`settings` with remat and micro-batch picked (module doc), and the choice, whose line is logged
    when something was picked; `detail` gets a line per candidate tried."""
    choice = choose(settings, limit, peak_of, platform, log=detail, warn=log)
    if choice.auto:
        log(choice.line())
        return choice.apply(settings), choice
    return settings, choice


__all__ = ["Candidate", "Choice", "NothingFits", "auto_settings", "candidates", "choose", "decide", "pick_memory",
           "plan_training_peak"]
