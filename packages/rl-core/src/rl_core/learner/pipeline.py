"""PolicyGradientLearner: rl-core's concrete learner, the pipeline every variant runs, as small
overridable steps (sample G completions per prompt, score, advantages, log-probs, records).

produce_examples(prompts)
  = collect(prompts, supply)         the rollout half (async rollouts run it beside the update)
    = sample_groups(prompts, supply) the step's groups and the supply past them (DAPO's
                                     dynamic sampling overrides this: more prompts, a carry)
      = collect_groups(prompts)      rollout + score
  -> examples_from(groups)           the training half, under the current weights
    = example_from_groups(groups)    what the update needs (PPO overrides this):
       compute_advantages(groups)    the configured estimator
       -> to_example(groups, adv)    arrays for the update, with the masks
       -> add_logprobs(example)      behaviour log-probs (when the update can be off-policy),
                                     reference log-probs (beta != 0), the distillation
                                     teacher's (distill_coef != 0)

The update then differentiates `loss_function()`: rl_core.train.objective.policy_objective
with this run's settings bound (see rl_core.learner.base for the path from the learner).
GRPO (package algo-grpo) is this pipeline with PolicyGradientConfig's defaults; a variant overrides
the config's defaults and the one step it changes. G = 1 is allowed where the config's
estimator category takes a critic's values (PPO).

Behaviour log-probs follow rl_core.learner.base's contract: recorded by the
learner's own forward pass at collection time whenever the update can be
off-policy (several iterations or mini-batches, or rows carried from an
earlier step, which keep the log-probs recorded when they were collected);
skipped only on a provably on-policy step, where stop_gradient(logp) is equal.
Which passes a step runs (behaviour, proximal, reference) is decided in one place,
`passes` (rl_core.train.behaviour.LogprobPasses), from the config and the batch layout.

The algorithm's own reward functions (`config.reward_functions`, e.g. DAPO's
overlong shaping) are added to the reward manager here, so a learner built
directly from the library applies them too.

Async rollouts (training.async_rollout = "one_step") sample with weights one step
(up to training.max_staleness = k steps) older than the update's. The update then follows decoupled PPO (AReaL): every row's
`old_logp` is the proximal policy's, the current weights' at training time (none is
recorded at collection, when the update may be changing the weights), the clipped
ratio is taken against it, and the rollout correction (rl_core.correction_config:
the config's, or by default the truncated importance weight min(pi_prox / pi_sampler, 2))
corrects for the stale sampler.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from rl_core import registry

from rl_core.runtime import multihost
from rl_core.train.behaviour import LogprobPasses, PolicyLogprobs
from rl_core.train.frozen_model import teacher_model
from rl_core.data import Prompt, Supply
from rl_core.episodes import EpisodeRecord, episode_metrics
from rl_core.episodes.segments import expand
from rl_core.learner.groups import TOTAL, Groups, version_lag_metrics
from rl_core.learner.base import KeyStream, RLLearner, StepBatch
from rl_core.train.objective import policy_loss_function
from rl_core.pipeline_config import PolicyGradientConfig
from rl_core.config import RolloutConfig
from rl_core.correction_config import resolve_correction
from rl_core.math.advantages import takes_reward_scores
from rl_core.train.trainable import LossFn
from rl_core.types import TrainExample


class PolicyGradientLearner(RLLearner[PolicyGradientConfig]):
    """The policy-gradient pipeline; with GRPO's config, GRPO's Algorithm 1 (arXiv:2402.03300).

    For each batch of prompts: sample G completions per prompt, score them,
    turn the rewards into advantages with the configured estimator, and take
    clipped-surrogate steps with a KL penalty to the initial policy.
    """

    def __init__(self, config: PolicyGradientConfig, *, teacher: Any = None, **kwargs: Any) -> None:
        """`teacher`: the frozen model to distill from (an NNX module with the policy's vocabulary),
        needed exactly when config.distill_coef != 0; the other arguments are RLLearner's."""
        super().__init__(config, **kwargs)
        # which log-prob passes a step runs, decided once from the config and the batch layout
        self.passes = LogprobPasses.of(config, num_mini_batches=self.num_mini_batches,
                                       async_rollout=self.training.async_rollout)
        if self.reward_manager is None:
            raise ValueError(f"{type(self).__name__} needs a reward_manager to score completions")
        extra = config.reward_functions(max_new_tokens=self.rollout.max_new_tokens)
        twice = sorted({fn.__name__ for fn in extra} & set(self.reward_manager.names))
        if twice:
            raise ValueError(
                f"the reward manager already holds {twice}: {type(self).__name__} adds its algorithm's own "
                f"reward functions ({type(config).__name__}.reward_functions) itself; give it the task's rewards only"
            )
        self.reward_manager = self.reward_manager.with_functions(extra)
        # The sampler reports log-probs under the whole tempered softmax (top-k / top-p only choose
        # the token), so the weight measures the sampler's mismatch with the trainer. Greedy tokens
        # are drawn from no distribution: the weight means nothing there.
        correction = resolve_correction(config)
        if correction.on and self.rollout.temperature == 0:
            raise ValueError(
                f"{type(config).__name__}: rollout correction {correction.mode} (cap {correction.cap}; tis_cap = "
                f"{config.tis_cap}, training.async_rollout = {self.training.async_rollout!r}) "
                "with RolloutConfig.temperature = 0: greedy tokens are not samples of the distribution whose "
                "log-probs the sampler reports, so the importance weight pi_old / pi_sampler is meaningless; "
                "sample (temperature > 0) or set algorithm.rollout_correction.mode=off (and tis_cap unset)"
            )
        self._advantages = self.advantage_program()
        # The reference policy is the initial one, kept only when the KL term is on: the
        # caller's module itself, or with adapters the base with adapters off (no copy either way).
        self.ref_params = self.reference_params(kwargs["policy"]) if self.passes.reference else None
        # the distillation teacher: frozen, its log-prob pass the reference's over its own weights
        self.teacher = teacher_model(teacher, kwargs["policy"], distill_coef=config.distill_coef, layout=self.layout)
        self._teacher_pass = PolicyLogprobs(self.teacher, self.rollout) if self.teacher is not None else None

    # -- base-learner hooks ---------------------------------------------------------------

    @property
    def num_iterations(self) -> int:
        return self.config.num_iterations

    @property
    def group_size(self) -> int:
        return self.config.group_size

    def trajectory_ids(self, prompts: Sequence[Prompt]) -> list[str]:
        step = self.step + 1  # the step being produced: samples.jsonl records it after the counter advances
        return [f"step{step}/prompt{i}/sample{j}" for i in range(len(prompts)) for j in range(self.group_size)]

    def collect(self, prompts: Sequence[Prompt], supply: Supply) -> tuple[Groups, Supply]:
        """Scored groups, with what their collection cost in `info` (timings, tokens, failures),
        and the supply past them (its key past the samples' keys)."""
        draw = Draw(KeyStream(supply.rng), _collection_tally())
        groups, supply = self.sample_groups(prompts, supply, draw)
        return dataclasses.replace(groups, info={**groups.info, **draw.tally}), supply._replace(rng=draw.keys.key)

    def scores_apart(self) -> bool:
        """True unless a variant changes the collection (DAPO's dynamic sampling draws more prompts
        as the scores come in): then `collect` is `collect_unscored` and then `score_collected`."""
        own = PolicyGradientLearner
        return all(getattr(type(self), name) is getattr(own, name)
                   for name in ("collect", "sample_groups", "collect_groups"))

    def collect_unscored(self, prompts: Sequence[Prompt], supply: Supply) -> tuple[Groups, Supply]:
        """`collect`'s generation half: the groups unscored (`score_collected` scores them), with
        what their generation cost in `info`, and the supply past them."""
        draw = Draw(KeyStream(supply.rng), _collection_tally())
        groups = self.rollout_groups(prompts, draw)
        return dataclasses.replace(groups, info={**groups.info, **draw.tally}), supply._replace(rng=draw.keys.key)

    def score_collected(self, groups: Groups) -> Groups:
        """`collect`'s scoring half, on any thread: `collect_unscored`'s groups scored, its tally
        in `info` continued (the same numbers `collect` returns)."""
        draw = Draw(tally=dict(groups.info))
        scored = self.score(groups, draw)
        return dataclasses.replace(scored, info=draw.tally)

    def sample_groups(self, prompts: Sequence[Prompt], supply: Supply, draw: Draw | None = None
                      ) -> tuple[Groups, Supply]:
        """The step's scored groups from `prompts` and what `supply` holds, and the supply past
        them (default: one group per prompt, the supply unchanged), drawing keys from and counting
        into `draw` (the collection's)."""
        return self.collect_groups(prompts, draw), supply

    def examples_from(self, groups: Groups) -> StepBatch:
        tally = {"time/rollout": 0.0, "time/reward": 0.0}
        # and what reward functions reported about their calls (e.g. a judge model's time/judge)
        tally |= {k: v for k, v in groups.info.items() if k.startswith(("time/", "rewards/"))}
        example = self.example_from_groups(groups, tally)  # adds time/logprob
        adv = example.advantages[: len(groups.rewards)]  # the episodes' (segment rows repeat them)
        metrics = {**self.group_metrics(groups, adv), **tally}
        if groups.token_version is not None:  # per token: partial rollouts mix versions within a row
            metrics.update(version_lag_metrics(groups.token_version, groups.completion_mask, self.step))
        # generated: what the backend decoded (padding rows and a turn's tokens past where its episode
        # cut it included); kept: the model tokens the completions hold (episodes' turns as cut)
        tokens = groups.info.get("perf/generated_tokens", 0.0)
        kept = groups.info.get("perf/kept_tokens", tokens)
        metrics["perf/generated_tokens"] = tokens
        metrics["perf/kept_tokens"] = kept
        metrics["perf/decoded_per_kept"] = tokens / kept if kept else 1.0
        # prompt tokens the engine prefilled, and those it continued from an episode's retained sequence
        metrics |= {k: v for k, v in groups.info.items() if k in ("perf/prefill_tokens", "perf/reused_prefix_tokens")}
        if groups.segments is not None:  # rows beyond the episodes': rewritten histories' earlier segments
            metrics["episodes/earlier_segments"] = float(len(groups.segments))
        if groups.versions is not None:  # the weights that sampled the rows (carried groups: older ones)
            metrics["rollout/version_min"] = float(groups.versions.min())
            metrics["rollout/version_max"] = float(groups.versions.max())
        return StepBatch(example, metrics, self.samples(groups, adv), int(tokens))

    def batch_to_json(self, batch: Groups) -> dict[str, Any]:
        return batch.to_json()

    def batch_from_json(self, data: Any) -> Groups:
        return Groups.from_json(data)

    def loss_function(self) -> LossFn:
        """This run's `loss_of`: what the policy's update differentiates."""
        return self.loss_of(self.config, self.rollout, self.passes)

    @classmethod
    def loss_of(cls, config: PolicyGradientConfig, rollout: RolloutConfig, passes: LogprobPasses) -> LossFn:
        """The policy's loss of one micro-batch for a run of these settings, a pure function of them:
        `policy_objective` with the registered functions the config names, the clip widths, the KL
        term (`passes.loss_beta`) and the sampler's temperature bound. A variant that changes the
        loss overrides this (SAPO's gate), so `trainer plan` compiles, without a learner, the loss
        the learner trains."""
        return policy_loss_function(config, rollout, beta=passes.loss_beta, proximal=passes.proximal)

    @classmethod
    def example_spec(cls, config: PolicyGradientConfig, passes: LogprobPasses, *, rows: int, prompt_tokens: int,
                     completion_tokens: int) -> TrainExample:
        """The TrainExample a step of these settings trains on (`examples_from`'s), as
        ShapeDtypeStructs of `rows` rows at the widest shapes: the fields it fills (behaviour
        log-probs when `passes.behaviour`, the reference's and the teacher's when they run, the
        sampler's always; per-token advantages for a token estimator) and no other; the batch
        layout adds the packed rows and shared prompts for the update (rl_core.train.layout).
        A variant that adds fields extends it (PPO's returns and values)."""
        def per_token(present: bool = True, dtype: Any = np.float32) -> jax.ShapeDtypeStruct | None:
            return jax.ShapeDtypeStruct((rows, completion_tokens), dtype) if present else None

        prompt = lambda dtype: jax.ShapeDtypeStruct((rows, prompt_tokens), dtype)  # noqa: E731
        per_token_advantages = config.estimator_category == "token_advantage_estimator"
        return TrainExample(
            prompt_tokens=prompt(np.int32), prompt_mask=prompt(np.float32),
            completion_tokens=per_token(dtype=np.int32), completion_mask=per_token(),
            advantages=per_token() if per_token_advantages else jax.ShapeDtypeStruct((rows,), np.float32),
            old_logp=per_token(passes.behaviour), ref_logp=per_token(passes.reference), sampler_logp=per_token(),
            teacher_logp=per_token(passes.teacher),
        )

    # -- pipeline steps -------------------------------------------------------------------

    def collect_groups(self, prompts: Sequence[Prompt], draw: Draw | None = None) -> Groups:
        """Generate and score one group per prompt."""
        draw = draw or Draw()
        return self.score(self.rollout_groups(prompts, draw), draw)

    def rollout_groups(self, prompts: Sequence[Prompt], draw: Draw | None = None, *,
                       key: jax.Array | None = None) -> Groups:
        """G sampled completions (or episodes, with `rollout.environment`) per prompt, decoded;
        rewards not yet filled in. Keys from `draw.keys` (a collection's; without one the state's
        training stream) unless `key` is given (e.g. for an evaluation); costs counted into `draw.tally`."""
        draw = draw or Draw()
        start = time.perf_counter()
        g = self.group_size
        # one prefill per group; every process gets every row (a multi-process run gathers them)
        rolled = self._rollout_prompts(prompts, g, key=key, keys=draw.keys)
        out = rolled.completions
        tally = draw.tally
        tally["time/rollout"] += time.perf_counter() - start
        kept = float(int(out.lengths.sum()))
        decoded = kept if rolled.decoded_tokens is None else float(rolled.decoded_tokens)
        tally["perf/generated_tokens"] = tally.get("perf/generated_tokens", 0.0) + decoded
        tally["perf/kept_tokens"] = tally.get("perf/kept_tokens", 0.0) + kept
        if rolled.prefill_tokens is not None:  # a backend that counts them (the paged engine)
            for name, value in (("perf/prefill_tokens", rolled.prefill_tokens),
                                ("perf/reused_prefix_tokens", rolled.reused_tokens or 0)):
                tally[name] = tally.get(name, 0.0) + float(value)
        return Groups(
            group_size=g,
            prompts=tuple(prompts),
            prompt_tokens=rolled.prompt_tokens,
            prompt_mask=rolled.prompt_mask,
            completion_tokens=np.asarray(out.tokens),
            completion_mask=np.asarray(out.mask),
            sampler_logp=np.asarray(out.logp),
            token_version=None if out.token_version is None else np.asarray(out.token_version, np.int32),
            lengths=np.asarray(out.lengths),
            truncated=np.asarray(out.truncated),
            texts=rolled.texts,
            rewards=np.zeros(len(out.lengths), np.float32),
            row_fields=rolled.row_fields(),
            versions=np.full(len(out.lengths), self._sampling_version(), np.int32),
            segments=rolled.segments,
        )

    def score(self, groups: Groups, draw: Draw | None = None) -> Groups:
        """Fill in rewards with the reward manager (task fields passed by name).

        In a multi-process run each process scores its own block of whole groups (reward
        functions are the costly host work) and the scores are gathered, so every process
        then takes the same decisions (advantages, DAPO's filter) on the same numbers.
        """
        start = time.perf_counter()
        g = self.group_size
        counts = [n * g for n in multihost.split_counts(groups.num_groups)]
        own = multihost.own_block(groups.num_groups)
        mine = groups.select(np.arange(groups.num_groups)[own])
        prompts = [p for p in mine.prompts for _ in range(g)]
        names = sorted({k for p in mine.prompts for k in p.fields})
        fields = {k: [p.fields.get(k) for p in prompts] for k in names}
        fields["completion_lengths"] = [int(n) for n in mine.lengths]  # model tokens, in an episode
        fields.update({k: list(v) for k, v in mine.row_fields.items()})  # e.g. each row's `episode`
        fields["completion_ids"] = [row[:n].tolist() for row, n in zip(mine.completion_tokens, mine.lengths)]  # TRL's
        result = self.reward_manager.score([p.text for p in prompts], list(mine.texts), fields, step=self.step + 1)
        tally = (draw or Draw()).tally
        tally["time/reward"] += time.perf_counter() - start
        gather = lambda x: multihost.gather_rows(np.asarray(x, np.float32), counts)  # noqa: E731
        failed = int(multihost.gather_rows(np.asarray([result.num_failed]), [1] * len(counts)).sum())
        tally["rewards/failed"] = tally.get("rewards/failed", 0.0) + float(failed)
        for name, value in result.function_metrics.items():  # this process's, summed over the step's rounds
            tally[name] = tally.get(name, 0.0) + value
        return dataclasses.replace(
            groups,
            rewards=gather(result.total),
            reward_scores={k: gather(v) for k, v in result.per_function.items()},
        )

    def record_behaviour_logprobs(self, groups: Groups) -> Groups:
        """`groups` with the current policy's log-probs filled in for rows that lack them.

        Call at collection time, before any update: these are the log-probs of the
        policy that sampled the rows. With async rollouts it records nothing (the update
        may be changing the weights; every row gets the proximal log-probs at training time):
        `passes.at_collection` decides.
        """
        segments = groups.segments  # a rewritten history's earlier segments: theirs too
        missing = groups.missing_old_logp()
        if segments is not None and segments.missing_old_logp():
            missing = np.concatenate([missing, [True]])
        if not self.passes.at_collection(missing):
            return groups
        old = self.behaviour_logprobs(
            groups.prompt_tokens, groups.prompt_mask, groups.completion_tokens, recorded=groups.old_logp,
            completion_mask=groups.completion_mask,
        )
        if segments is not None and segments.missing_old_logp():
            segments = dataclasses.replace(segments, old_logp=np.asarray(self.behaviour_logprobs(
                segments.prompt_tokens, segments.prompt_mask, segments.completion_tokens, recorded=segments.old_logp,
                completion_mask=segments.completion_mask), np.float32))
        return dataclasses.replace(groups, old_logp=old, segments=segments)

    def example_from_groups(self, groups: Groups, tally: dict[str, float] | None = None) -> TrainExample:
        """What one update needs from scored groups: advantages, arrays and log-probs (their
        seconds in `tally`, as time/logprob)."""
        example = self.to_example(groups, self.compute_advantages(groups))
        if groups.segments is not None:  # rewritten histories' earlier segments, with their episode's advantage
            rows = self.layout.rows_for(len(groups.rewards) + len(groups.segments))
            example = expand(example, groups.segments, rows, pad_id=self.tokenizer.pad_id)
        start = time.perf_counter()
        example = self.add_logprobs(example)
        if tally is not None:
            tally["time/logprob"] = time.perf_counter() - start
        return example

    def advantage_program(self) -> Callable[..., Any]:
        """The configured estimator, jitted: one dispatch instead of a dozen eager ops per step."""
        return jax.jit(registry.get("advantage_estimator", self.config.advantage_estimator), static_argnums=1)

    def compute_advantages(self, groups: Groups) -> np.ndarray:
        """The configured estimator on the groups' total rewards; one that reads each reward
        function's scores (GDPO, `takes_reward_scores`) also gets them [K, B] and their weights [K]."""
        estimator = registry.get(self.config.estimator_category, self.config.advantage_estimator)
        if takes_reward_scores(estimator) and groups.reward_scores:
            names = list(groups.reward_scores)
            weights = {spec.name: spec.weight for spec in getattr(self.reward_manager, "specs", ())}
            unweighted = [name for name in names if name not in weights]
            if unweighted:
                raise ValueError(f"advantage_estimator {self.config.advantage_estimator!r} weighs each reward "
                                 f"function's scores, but the reward manager has no weight for {unweighted}")
            scores = np.stack([np.asarray(groups.reward_scores[name], np.float32) for name in names])
            w = np.asarray([weights[name] for name in names], np.float32)
            return np.asarray(self._advantages(groups.rewards, self.group_size, scores=scores, weights=w))
        return np.asarray(self._advantages(groups.rewards, self.group_size))

    def to_example(self, groups: Groups, advantages: np.ndarray) -> TrainExample:
        mask = groups.completion_mask
        if self.config.mask_truncated_completions:
            mask = mask * ~groups.truncated[:, None]
        # host arrays: the update's input transfer sends them all at once
        return TrainExample(
            prompt_tokens=groups.prompt_tokens,
            prompt_mask=groups.prompt_mask,
            completion_tokens=groups.completion_tokens,
            completion_mask=np.asarray(mask, np.float32),
            advantages=np.asarray(advantages, np.float32),
            sampler_logp=groups.sampler_logp,
            old_logp=groups.old_logp,
        )

    def add_logprobs(self, example: TrainExample) -> TrainExample:
        """Behaviour log-probs when the update can be off-policy, truncated importance sampling
        is on, a KL penalty in the rewards reads them, or some rows already carry theirs
        (carried rows); reference log-probs only when beta != 0 (`passes` decides).

        Runs before any update of the step, so the current policy is the one that sampled
        the rows without recorded log-probs.
        """
        run, recorded = self.passes.before_update(example.old_logp)
        if run:
            old = self.behaviour_logprobs(
                example.prompt_tokens, example.prompt_mask, example.completion_tokens, recorded=recorded,
                completion_mask=example.completion_mask,
            )
            example = example._replace(old_logp=old)
        if self.passes.reference:
            example = example._replace(ref_logp=self.reference_logprobs(example))
        if self.passes.teacher:
            example = example._replace(teacher_logp=self._teacher_logprobs(example))
        return example

    def reference_logprobs(self, example: TrainExample) -> jax.Array:
        return self.compute_logprobs(self.ref_params, example)[0]

    def _teacher_logprobs(self, example: TrainExample) -> jax.Array:
        """[B, T] log-probs of the example's completions under the distillation teacher."""
        if self.meter is not None:
            self.meter.scored("teacher", example)
        return self._teacher_pass(self.teacher.params, example)[0]

    # -- reporting ------------------------------------------------------------------------

    def group_metrics(self, groups: Groups, advantages: np.ndarray) -> dict[str, float]:
        """Metrics of the groups trained on (every reward function's over the same rows)."""
        lengths = groups.lengths.astype(np.float64)
        metrics = {}
        for name, scores in groups.reward_scores.items():
            metrics[f"rewards/{name}/mean"] = float(scores.mean())
            metrics[f"rewards/{name}/frac_positive"] = float((scores > 0).mean())
        metrics.update(
            {
                "rewards/total/mean": float(groups.rewards.mean()),
                "rewards/total/std": float(groups.rewards.std()),
                "rewards/failed": float(groups.info.get("rewards/failed", 0.0)),
                "groups/uniform_frac": float(groups.uniform(TOTAL).mean()),
                "advantages/mean": float(advantages.mean()),
                "advantages/std": float(advantages.std()),
                "completions/length_mean": float(lengths.mean()),
                "completions/length_min": float(lengths.min()),
                "completions/length_max": float(lengths.max()),
                "completions/truncated_frac": float(groups.truncated.mean()),
            }
        )
        if "episode" in groups.row_fields:
            metrics.update(episode_metrics([EpisodeRecord.from_json(e) for e in groups.row_fields["episode"]]))
        if self.reward_audit is not None:  # signs of reward hacking (rl_core.learner.reward_audit)
            weights = {spec.name: spec.weight for spec in getattr(self.reward_manager, "specs", ())}
            metrics.update(self.reward_audit(
                step=self.step + 1, total=groups.rewards.tolist(), weights=weights, group_size=self.group_size,
                per_function={name: scores.tolist() for name, scores in groups.reward_scores.items()},
                lengths=groups.lengths.tolist(), finished=(~groups.truncated).tolist()))
        return metrics

    def samples(self, groups: Groups, advantages: np.ndarray) -> list[dict[str, Any]]:
        ids = self.trajectory_ids(groups.prompts)
        g = self.group_size
        out = [
            {
                "id": ids[i],
                "prompt": groups.prompts[i // g].text,
                "completion": groups.texts[i],
                "reward": float(groups.rewards[i]),
                "advantage": float(advantages[i]),
                "length": int(groups.lengths[i]),  # tokens, with EOS
                # each reward function's own (unweighted) score: what the console table and trackers show
                "rewards": {name: float(scores[i]) for name, scores in groups.reward_scores.items()},
            }
            for i in range(len(groups.texts))
        ]
        # the weights' step count that sampled the row (with partial rollouts: its first tokens)
        if groups.versions is not None:
            for sample, version in zip(out, groups.versions.tolist(), strict=True):
                sample["version"] = version
        for sample, episode in zip(out, groups.row_fields.get("episode", ()), strict=False):
            # every turn with its role; the completion column shows the whole episode
            record = EpisodeRecord.from_json(episode)
            sample.update(completion=record.transcript(), turns=episode["turns"], turn_rewards=list(record.rewards))
        return out


@dataclasses.dataclass
class Draw:
    """What one collection draws on and counts, passed down its steps as a value (no thread holds
    it): its sampling keys (`keys`, a KeyStream split from the supply's key; None: the learner
    state's training stream) and its tally (seconds, tokens generated, reward failures)."""

    keys: KeyStream | None = None
    tally: dict[str, float] = dataclasses.field(default_factory=lambda: {"time/rollout": 0.0, "time/reward": 0.0})


def _collection_tally() -> dict[str, float]:
    """What a collection counts from zero: every sampled token counts, including groups a variant then drops."""
    return {"time/rollout": 0.0, "time/reward": 0.0, "perf/generated_tokens": 0.0, "perf/kept_tokens": 0.0,
            "rewards/failed": 0.0}
