"""`trainer compare`: every variant, several seeds, from the same base policy, prompts and budget.

Each variant trains `seeds` times from one cached base policy; seed n sets
`training.seed` (data order) and `rollout.seed` (sampling) to the configured
value + n, the same for every variant. Every variant generates the same number of
completions per step (GRPO's prompts x G): one that samples fewer per prompt (PPO)
sees more prompts. The report gives each metric's mean
over seeds with a 95% confidence interval and says which differences are
significant.

A compare config may name its variants instead of listing algorithms, each an
algorithm with settings of its own over the shared ones, so one algorithm can be
compared with itself under other settings (sync and async rollouts):

    variants:
      grpo: {}                                # a name alone: that algorithm as configured
      grpo-async:
        algo: grpo
        training: {async_rollout: one_step}
        algorithm: {tis_cap: 2.0}
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rl_core import ConfigError, registry
from rl_core.run import EVAL_BEFORE, METRICS

from trainer.compare import folder as compare_folder
from trainer.compare.report import PLOTS, write_report
from trainer.judge.reward import judge_rewards
from trainer.run import plural, train_run
from trainer.run.teacher import load_teacher
from trainer.settings import (
    RunSettings,
    merge,
    parse_overrides,
    settings_from_user,
    user_settings,
)

DEFAULT_SEEDS = 3

COMPARE_DEFAULTS: tuple[str, ...] = (
    "training.num_steps=150",
    "training.learning_rate=5e-4",
)
"""Settings every compared variant starts from, under the user's --config and overrides:
half the training default's learning rate, because each batch makes MINI_BATCHES
optimizer steps, not one; 150 steps, so that seven variants x three seeds stay
under ten minutes on a 2-core CPU."""

MINI_BATCHES = 4
"""Unless `training.mini_batch_size` is set, each step's completions are split into
this many mini-batches, so the policy moves within a batch and the ratio clipping
that tells the variants apart engages (a count, not a size: it fits any
prompts_per_step and group size; a batch it does not divide stays whole)."""

REFERENCE_ALGO = "grpo"
"""The report lists, per variant, the config fields that differ from this algorithm's."""


def variant_settings(algos: Sequence[str], user: Mapping[str, Any]) -> list[RunSettings]:
    """One `RunSettings` per algorithm from settings shared by all of them.

    An `algorithm.<field>` applies to the algorithms whose config has that
    field (DAPO's max_gen_batches to DAPO only); a field that no compared
    algorithm has is an error, with the closest field named.
    """
    algorithm = dict(user.get("algorithm") or {})
    fields = {a: {f.name for f in dataclasses.fields(registry.get_algorithm(a).config)} for a in algos}
    known = sorted(set().union(*fields.values()))
    for key in algorithm:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean 'algorithm.{close[0]}'?" if close else ""
            raise ConfigError(f"algorithm.{key}: no compared algorithm ({', '.join(algos)}) has this field{hint}")
    return [settings_for(a, user) for a in algos]


def named_variants(variants: Any, user: Mapping[str, Any], chosen: Sequence[str]) -> list[RunSettings]:
    """One `RunSettings` per entry of a config's `variants:` (name -> its algo and settings over
    `user`'s), in file order; `chosen` names keep only those."""
    if not isinstance(variants, Mapping) or not variants:
        raise ConfigError(f"variants: must map variant names to their settings, e.g. {{grpo-async: {{algo: grpo}}}}; "
                          f"got {variants!r}")
    unknown = [name for name in chosen if name not in variants]
    if unknown:
        raise ConfigError(f"variant(s) {unknown} not in the config's variants: {list(variants)}")
    out = []
    for name, own in variants.items():
        if chosen and name not in chosen:
            continue
        if own is not None and not isinstance(own, Mapping):
            raise ConfigError(f"variants.{name}: must be a mapping of settings, got {own!r}")
        own = dict(own or {})
        algo = str(own.pop("algo", name))
        try:
            fields = {f.name for f in dataclasses.fields(registry.get_algorithm(algo).config)}
        except registry.RegistryError as e:
            raise ConfigError(f"variants.{name}.algo = {algo!r}: {e}") from None
        wrong = sorted(set(own.get("algorithm") or {}) - fields)
        if wrong:
            raise ConfigError(f"variants.{name}.algorithm: {algo} has no field(s) {wrong}")
        settings = settings_for(algo, merge(user, own))
        out.append(dataclasses.replace(settings, variant=str(name)))
    return out


def settings_for(algo: str, user: Mapping[str, Any]) -> RunSettings:
    """`user`'s settings for `algo`, keeping only the algorithm fields that `algo`'s config has,
    with as many completions per step as the reference algorithm (`same_completions`)."""
    settings = same_completions(settings_from_user({**user, "algorithm": _own_fields(algo, user)}, algo), user)
    if (user.get("training") or {}).get("mini_batch_size") is not None:
        return settings
    training = settings.training
    completions = training.prompts_per_step * settings.algorithm_config().group_size
    mini = completions // MINI_BATCHES
    if completions % MINI_BATCHES or (isinstance(training.micro_batch_size, int) and mini % training.micro_batch_size):
        return settings
    return dataclasses.replace(settings, training=dataclasses.replace(training, mini_batch_size=mini))


def _own_fields(algo: str, user: Mapping[str, Any]) -> dict[str, Any]:
    fields = {f.name for f in dataclasses.fields(registry.get_algorithm(algo).config)}
    return {k: v for k, v in (user.get("algorithm") or {}).items() if k in fields}


def same_completions(settings: RunSettings, user: Mapping[str, Any]) -> RunSettings:
    """`settings` generating as many completions per step as REFERENCE_ALGO does with `user`'s
    settings (its prompts x G): a variant with smaller groups (PPO: one completion per prompt)
    trains on proportionally more prompts, so every variant spends the same rollout budget.
    Left as they are when the reference's completions do not split into the variant's groups."""
    g = settings.algorithm_config().group_size
    # only the group size sets the reference's budget: the rest of the shared settings may be ones the
    # reference alone refuses (a distilling variant's teacher without GRPO's distill_coef)
    sizes = {k: v for k, v in _own_fields(REFERENCE_ALGO, user).items() if k == "group_size"}
    reference = registry.get_algorithm(REFERENCE_ALGO).config.from_dict(sizes)
    total = settings.training.prompts_per_step * reference.group_size
    if total % g or total // g == settings.training.prompts_per_step:
        return settings
    return dataclasses.replace(settings, training=dataclasses.replace(settings.training, prompts_per_step=total // g))


def with_seed(settings: RunSettings, offset: int) -> RunSettings:
    training = dataclasses.replace(settings.training, seed=settings.training.seed + offset)
    rollout = dataclasses.replace(settings.rollout, seed=settings.rollout.seed + offset)
    return dataclasses.replace(settings, training=training, rollout=rollout)


def default_algos() -> list[str]:
    """Every installed algorithm but those that distill by default (algo-opd): they need a teacher
    (algorithm.teacher) the others must not be given; compare them by name or as `variants:`."""
    return [name for name in registry.registry.names("algorithm")
            if not getattr(registry.get_algorithm(name).config(), "distill_coef", 0)]


def compare(
    algos: Sequence[str],
    *,
    output: Path,
    config_file: str | None = None,
    overrides: Sequence[str] = (),
    seeds: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
    log: Callable[[str], None] = print,
) -> tuple[str, dict[str, Any]]:
    """Run each algorithm `seeds` times in `output/<algo>/seed-<n>` and write the report into `output`.

    Returns the printed text (table and significance) and the results written to results.json.
    """
    seeds = DEFAULT_SEEDS if seeds is None else seeds
    if seeds < 1:
        raise ConfigError(f"--seeds = {seeds}: must be >= 1")
    user = merge(parse_overrides(COMPARE_DEFAULTS), user_settings(config_file, overrides))
    variants = user.pop("variants", None)
    if variants is not None:
        all_settings = named_variants(variants, user, list(dict.fromkeys(algos)))
        reference = all_settings[0]  # the first variant: the report's differences are from it
    else:
        algos = list(dict.fromkeys(algos)) or default_algos()
        all_settings = variant_settings(algos, user)
        reference = settings_for(REFERENCE_ALGO, user)
    names = [s.name for s in all_settings]
    compare_folder.claim(output, names, [name for name, *_ in PLOTS], overwrite=overwrite)
    output.mkdir(parents=True, exist_ok=True)

    start = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for n in range(seeds):
        for settings in all_settings:
            run_dir = compare_folder.seed_dir(output, settings.name, n)
            # named as its folder is (seed-0 is the first), with the count
            log(f"compare: {settings.name}/{run_dir.name} ({n + 1} of {seeds} seeds) in {run_dir}")
            # one cached base policy (and its evaluation) for every variant and seed
            seeded = with_seed(settings, n)
            summary = train_run(
                seeded, run_dir, progress=progress, log=log, base_cache=output, overwrite=True,
                rewards=lambda task, cache, seeded=seeded: judge_rewards(seeded, task, cache_dir=cache, log=log),
                teacher=load_teacher,  # a distilling variant's (algorithm.teacher)
            )
            runs[settings.name].append({"seed": n, "summary": summary, "history": _history(run_dir)})
    wall = time.perf_counter() - start
    text, results = write_report(output, all_settings, reference, runs, wall_seconds=wall)
    log(f"compare: {plural(len(names), 'variant')} x {plural(seeds, 'seed')} in {wall:.1f} s; report in {output}")
    return text, results


def _history(run_dir: Path) -> list[dict]:
    """The run's metrics, starting with its base-policy evaluation as step 0."""
    before = json.loads((run_dir / EVAL_BEFORE).read_text())
    path = run_dir / METRICS
    return [{"step": 0, **before}] + [json.loads(line) for line in path.read_text().splitlines() if line]
