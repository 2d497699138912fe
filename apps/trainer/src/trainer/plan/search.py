"""`trainer plan`, when a run does not fit: the first settings that make it fit, cheapest first.

A plan's peak is the resident state (master weights, optimizer state, reference, frozen base)
plus the largest of its programs, one at a time. The training side (the update and the reference
pass) and the rollout side are searched apart, each for the cheapest change that brings it under
the limit, and the two changes are then planned together:

  training  (the update, the reference pass, and a critic's update and values pass when it has one)
            1. a fused attention kernel (model.attention=auto) where the platform has one: faster
               and without the [L, S] probabilities, so it comes first;
               for a mixture of experts, at every step below, meshes with an expert axis (its
               fsdp devices split into expert x fsdp: tokens move to the experts instead of
               every layer's experts being gathered; trainer.plan.experts.expert_layouts);
            2. a remat policy that keeps less, from the least recomputation to the most:
               dots_saveable, dots_with_no_batch_dims_saveable, full (offload is not tried:
               XLA:CPU keeps offloaded arrays on the device, so a plan cannot see what it saves);
            3. at each, micro-batches halved down to one row per device (the same gradients in
               more, smaller passes).
  rollout   the paged engine (its pool holds the pages in use, the static sampler a cache for the
            longest completion), then fewer decode slots per replica (halved down to 1).

A candidate whose program the target's compiler refuses (XLA:TPU: trainer.plan.refusal) is too much.
Each candidate is a full plan; compiled programs are shared by their lowered text, so a candidate
that changes only the rollout recompiles nothing and one that changes the remat policy compiles
the update alone. A training candidate that cannot fit is not compiled (`UpdateFloor`): at a
smaller micro-batch the update holds at least its bytes per row at a larger one with the same
other settings, so a 1.5B model's 256 rows of 8192 tokens on one device compile 6 updates, not 28.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from rl_core import ConfigError
from rl_core.rollout import PagedSettings, resolve_engine

from trainer.plan.device_memory import GIB
from trainer.plan.experts import expert_layouts
from trainer.plan.refusal import ProgramRefused
from trainer.plan.result import Plan

REMAT_ORDER = ("none", "dots_saveable", "dots_with_no_batch_dims_saveable", "full")
"""Remat policies from the least recomputation (and most memory) to the most."""


@dataclasses.dataclass(frozen=True)
class Fit:
    """Settings that fit: the overrides to add to the command, and their plan."""

    overrides: tuple[str, ...]
    plan: Plan


def search(base: Plan, settings: Any, settings_with: Callable[[Sequence[str]], Any], plan_of: Callable[[Any], Plan],
           log: Callable[[str], None] = lambda _: None) -> Fit | None:
    """The first settings (overrides on top of `settings`, built by `settings_with`) whose plan
    (`plan_of`) fits `base`'s budget; None when no change searched here is enough."""
    limit = base.budget.limit_bytes
    if base.startup_bytes > limit:
        log(f"the resident state alone ({base.startup_bytes / GIB:.2f} GiB at startup) is over the limit: "
            "spread it over more devices (training.mesh.fsdp) or train adapters (model.lora.rank)")
        return None

    def fits(plan: Plan, programs: Sequence[str]) -> bool:
        return plan.resident_bytes + max(plan.program_bytes[p] for p in programs) <= limit

    floor = UpdateFloor(micro_batches(settings)[0])

    def first(candidates: Iterator[tuple[str, ...]], programs: Sequence[str]) -> tuple[str, ...] | None:
        for overrides in candidates:
            if "update" in programs and floor.least(overrides) > limit:
                log(f"  {' '.join(overrides)}: update + resident at least {floor.least(overrides) / GIB:.2f} GiB "
                    f"-> too much (not compiled: {floor.why(overrides)})")
                continue
            try:
                plan = base if not overrides else plan_of(settings_with(overrides))
            except ConfigError as e:  # e.g. a micro-batch the devices do not divide
                log(f"  {' '.join(overrides)}: not a valid setting ({e})")
                continue
            except ProgramRefused as e:  # the target's compiler (XLA:TPU) refused one of its programs
                log(f"  {' '.join(overrides)}: too much ({e.verdict()})")
                continue
            if "update" in programs:
                floor.measured(overrides, plan.program_bytes["update"], plan.resident_bytes)
            worst = max(programs, key=lambda p: plan.program_bytes[p])
            ok = fits(plan, programs)
            log(f"  {' '.join(overrides) or '(as given)'}: {worst} {plan.program_bytes[worst] / GIB:.2f} GiB "
                f"+ resident {plan.resident_bytes / GIB:.2f} -> {'fits' if ok else 'too much'}")
            if ok:
                return overrides
        return None

    # the training side: the update and reference passes, and a critic's update and values pass
    programs = [p for p in ("update", "reference", "critic_update", "critic_values") if p in base.program_bytes]
    training = () if fits(base, programs) else first(training_candidates(base, settings), programs)
    rollout = () if fits(base, ("rollout",)) else first(rollout_candidates(settings), ("rollout",))
    if training is None or rollout is None:
        return None
    overrides = (*training, *rollout)
    try:
        plan = plan_of(settings_with(overrides))
    except ProgramRefused as e:
        log(f"  together, {' '.join(overrides)}: {e.verdict()}")
        return None
    log(f"  together, {' '.join(overrides)}: {plan.verdict()}")
    return Fit(overrides, plan) if plan.fits else None


class UpdateFloor:
    """A lower bound on a training candidate's update plus resident bytes, from the candidates measured so far.

    The update's temporaries are a part that does not depend on the micro-batch (gradients, the
    step's buffers) plus activations proportional to its rows, so at m rows they are at least
    m times their bytes per row at any larger micro-batch with the same other settings (attention,
    layout, remat), less SLACK. Measured on the Qwen2.5-1.5B shape at 8192 new tokens, remat=full:
    3.77, 3.86, 3.98, 4.21, 4.66, 5.58 GiB per row at 256 down to 8 rows, but 5.50 at 4: XLA's
    buffer assignment is not exactly proportional, so a candidate is ruled out only with room to spare."""

    MICRO = "training.micro_batch_size="
    SLACK = 0.2
    """The share of the proportional bound given up (the 4-row update above is 1.4% under it)."""

    def __init__(self, micro: int) -> None:
        self.micro = micro
        """The run's own micro-batch size (a candidate without the override has it)."""
        self.per_row: dict[tuple[str, ...], tuple[int, float, int]] = {}
        """Other settings -> (rows, update bytes per row, resident bytes) of the smallest micro-batch measured
        with them (the resident state does not depend on the micro-batch)."""

    def _split(self, overrides: tuple[str, ...]) -> tuple[tuple[str, ...], int]:
        micro = next((int(o.removeprefix(self.MICRO)) for o in overrides if o.startswith(self.MICRO)), self.micro)
        return tuple(o for o in overrides if not o.startswith(self.MICRO)), micro

    def measured(self, overrides: tuple[str, ...], update_bytes: int, resident_bytes: int) -> None:
        others, micro = self._split(overrides)
        if others not in self.per_row or micro < self.per_row[others][0]:
            self.per_row[others] = (micro, update_bytes / micro, resident_bytes)

    def least(self, overrides: tuple[str, ...]) -> float:
        """At least this many bytes of update and resident state (0 when nothing at a larger micro-batch with
        the same other settings was measured)."""
        others, micro = self._split(overrides)
        rows, per_row, resident = self.per_row.get(others, (0, 0.0, 0))
        return resident + (1 - self.SLACK) * micro * per_row if rows > micro else 0.0

    def why(self, overrides: tuple[str, ...]) -> str:
        others, micro = self._split(overrides)
        rows, per_row, resident = self.per_row[others]
        return (f"{micro} rows x the {per_row / GIB:.2f} GiB per row measured at {rows}, less {self.SLACK:.0%}, "
                f"+ resident {resident / GIB:.2f}")


def training_candidates(base: Plan, settings: Any) -> Iterator[tuple[str, ...]]:
    """Attention, then remat policies, then smaller micro-batches (module doc)."""
    model = settings.model
    attention = ("model.attention=auto",) if base.attention == "xla" and base.auto_attention != "xla" else ()
    # offload keeps what dots_with_no_batch_dims_saveable keeps; auto not yet picked keeps everything
    current = {"offload": "dots_with_no_batch_dims_saveable", "auto": "none"}.get(model.remat, model.remat)
    given = "none" if model.remat == "auto" else model.remat  # what the plan as given compiled
    remats = REMAT_ORDER[REMAT_ORDER.index(current):]
    micros = micro_batches(settings)
    training = settings.training
    # a mixture of experts: meshes with an expert axis, each tried before more recomputation
    layouts = [(), *expert_layouts(base.experts, training.mesh.shape(jax.device_count() - training.rollout_devices))]
    for micro in micros:
        for remat in remats:
            for layout in layouts:
                yield (*attention, *layout, *((f"model.remat={remat}",) if remat != given else ()),
                       *((f"training.micro_batch_size={micro}",) if micro != micros[0] else ()))


def rollout_candidates(settings: Any) -> Iterator[tuple[str, ...]]:
    """The paged engine, then fewer decode slots per replica (one replica per data/fsdp device)."""
    rollout = settings.rollout
    engine = () if resolve_engine(rollout) == "paged" else ("rollout.engine=paged",)
    if engine:
        yield engine
    batch, replicas = _rows(settings)
    knobs = rollout.engine_settings() if not engine else PagedSettings()  # the paged engine's settings
    slots = min(knobs.slots, -(-batch // replicas))  # more slots than completions would idle
    while slots > 1:
        slots //= 2
        yield (*engine, f"rollout.options.slots={slots}")


def micro_batches(settings: Any) -> list[int]:
    """The run's micro-batch size, then its halves while the (data, fsdp) devices divide them."""
    batch, devices = _rows(settings)
    n_mini, n_micro = settings.training.batch_layout(batch)
    micro = batch // (n_mini * n_micro)
    sizes = [micro]
    while micro % 2 == 0 and (micro // 2) % devices == 0:
        micro //= 2
        sizes.append(micro)
    return sizes


def _rows(settings: Any) -> tuple[int, int]:
    """(completions per step, the data x fsdp x expert devices they are split over)."""
    training = settings.training
    rows = training.mesh.row_devices(jax.device_count() - training.rollout_devices)
    return training.prompts_per_step * settings.algorithm_config().group_size, rows
