"""PolicyGradientLearner: rl-core's concrete learner, the pipeline every variant runs, as small
overridable steps (sample G completions per prompt, score, advantages, log-probs, records).

_collect(prompts, supply)            the rollout half (rl_core.learner.base runs it now, or k steps
                                     ahead; `_collection()` cuts it in two, scoring on its own,
                                     unless the variant declares `_draws_on_scores`)
  = _sample_groups(prompts, supply)  the step's groups and the supply past them (DAPO's dynamic
                                     sampling overrides this: more prompts, a carry):
                                     _rollout_groups (rl_core.learner.collection.groups_of_rollout)
                                     -> _score (score_groups)
_examples_from(groups)               the training half, under the current weights
  = _example_from_groups(groups)     what the update needs (PPO overrides this):
     _compute_advantages(groups)     the configured estimator
     -> _to_example(groups, adv)     arrays for the update, with the masks
     -> _add_logprobs(example)       behaviour (when the update can be off-policy), reference
                                     (beta != 0) and teacher (distill_coef != 0) log-probs
  + _group_metrics, _samples         the records (rl_core.learner.records)

The steps are protected (rl_core.learner.hooks says why): a variant overrides or calls them.

The update differentiates `_loss_function()`, the classmethod `loss_of` of the settings (which
`trainer plan` compiles too; SAPO overrides it). Which log-prob passes a step runs is decided
once, `LogprobPasses` (rl_core.train.behaviour), from the config and the batch layout. The
algorithm's own reward functions (`config.reward_functions`, e.g. DAPO's overlong shaping) join
the reward manager here. With async rollouts (weights up to training.max_staleness steps older
than the update's) every row's `old_logp` is the proximal policy's, the current weights' at
training time (decoupled PPO, AReaL), and the rollout correction (rl_core.correction_config)
corrects for the stale sampler.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import jax
import numpy as np

from rl_core import registry
from rl_core.config import RolloutConfig
from rl_core.correction_config import resolve_correction
from rl_core.data import CollectionInputs, Prompt
from rl_core.episodes.rollout import collect_rollout
from rl_core.episodes.runner import Rollout
from rl_core.episodes.segments import expand
from rl_core.learner import records
from rl_core.learner.base import RLLearner, StepBatch
from rl_core.learner.state import POLICY
from rl_core.learner.collection import groups_of_rollout, score_groups
from rl_core.learner.draw import KeysAndTally, KeyStream, collection_tally
from rl_core.learner.groups import Groups
from rl_core.math.advantages import takes_reward_scores
from rl_core.pipeline_config import PolicyGradientConfig
from rl_core.rollout.async_rollout import Collection
from rl_core.train.behaviour import LogprobPasses, PolicyLogprobs
from rl_core.train.frozen_model import teacher_model
from rl_core.train.objective import policy_loss_function
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
        self._passes = LogprobPasses.of(config, num_mini_batches=self.layout.num_mini_batches,
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
        if self.training.packing and (config.routing_replay != "off" or config.router_aux_loss_coef):
            raise ValueError(f"{type(config).__name__}: routing_replay = {config.routing_replay!r}, router_aux_loss_coef"
                             f" = {config.router_aux_loss_coef} with training.packing = true: packed rows neither replay "
                             "a routing nor report one; set training.packing=false")
        # the configured estimator of group rewards, jitted (one dispatch instead of a dozen eager ops a
        # step); a token-level estimator's program is its learner's (PPO's reads the critic's values)
        self._advantages = (jax.jit(registry.get("advantage_estimator", config.advantage_estimator), static_argnums=1)
                            if config.estimator_category == "advantage_estimator" else None)
        self._logprob_pass = PolicyLogprobs(self.models[POLICY], self.rollout)  # (logp, entropy) [B, T]
        # The reference policy is the initial one, kept only when the KL term is on: the caller's
        # module itself, or with adapters the base with adapters off (no copy either way).
        policy = self.models[POLICY]
        self._ref_params = policy.initial_params(kwargs["policy"], self.params) if self._passes.reference else None
        # the distillation teacher: frozen, its log-prob pass the reference's over its own weights
        self._teacher = teacher_model(teacher, kwargs["policy"], distill_coef=config.distill_coef, layout=self.layout)
        self._teacher_pass = (PolicyLogprobs(self._teacher, self.rollout, replays=False)
                              if self._teacher is not None else None)

    # -- the loss and the batch, as `trainer plan` builds them without a learner ---------------

    def _loss_function(self) -> LossFn:
        """This run's `loss_of`: what the policy's update differentiates."""
        return self.loss_of(self._config, self.rollout, self._passes)

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
        """The TrainExample a step of these settings trains on, as ShapeDtypeStructs of `rows` rows
        at the widest shapes: the fields `_examples_from` fills (behaviour, reference and teacher
        log-probs when their passes run, the sampler's always; per-token advantages for a token
        estimator). A variant that adds fields extends it (PPO's returns and values)."""
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

    # -- the collection: rollout and scoring ---------------------------------------------------

    def _collect(self, prompts: Sequence[Prompt], supply: CollectionInputs) -> tuple[Groups, CollectionInputs]:
        """Scored groups, with what their collection cost in `info` (timings, tokens, failures),
        and the supply past them (its key past the samples' keys)."""
        draw = KeysAndTally(KeyStream(supply.rng), collection_tally())
        groups, supply = self._sample_groups(prompts, supply, draw)
        return dataclasses.replace(groups, info={**groups.info, **draw.tally}), supply._replace(rng=draw.keys.key)

    _draws_on_scores: ClassVar[bool] = False
    """True for a variant whose collection draws on its scores (DAPO draws more prompts while groups
    score alike) or that overrides `_collect` / `_sample_groups`: its collection then runs whole,
    `_collect`, and is never cut in two."""

    def _collection(self) -> Collection:
        """The collection cut in two, generation then scoring (which async rollouts run on a scoring
        thread), or whole when the variant declares `_draws_on_scores`."""
        if self._draws_on_scores:
            return Collection(self._collect, batch=Groups)
        return Collection(self._collect_unscored, score=self._score_collected, batch=Groups)

    def _collect_unscored(self, prompts: Sequence[Prompt], supply: CollectionInputs) -> tuple[Groups, CollectionInputs]:
        draw = KeysAndTally(KeyStream(supply.rng), collection_tally())
        groups = self._rollout_groups(prompts, draw)
        return dataclasses.replace(groups, info={**groups.info, **draw.tally}), supply._replace(rng=draw.keys.key)

    def _score_collected(self, groups: Groups) -> Groups:
        draw = KeysAndTally(tally=dict(groups.info))
        return dataclasses.replace(self._score(groups, draw), info=draw.tally)

    def _sample_groups(self, prompts: Sequence[Prompt], supply: CollectionInputs, draw: KeysAndTally | None = None
                      ) -> tuple[Groups, CollectionInputs]:
        """The step's scored groups from `prompts` and what `supply` holds, and the supply past
        them (default: one group per prompt, the supply unchanged), drawing keys from and counting
        into `draw` (the collection's)."""
        draw = draw or KeysAndTally()
        return self._score(self._rollout_groups(prompts, draw), draw), supply

    def _rollout_groups(self, prompts: Sequence[Prompt], draw: KeysAndTally | None = None, *,
                       key: jax.Array | None = None) -> Groups:
        """G sampled completions (or episodes, with `rollout.environment`) per prompt, decoded;
        rewards not yet filled in. Keys from `draw.keys` (without one the state's training stream)
        unless `key` is given (e.g. for an evaluation); costs counted into `draw.tally`."""
        draw = draw or KeysAndTally()
        start = time.perf_counter()
        # one prefill per group; every process gets every row (a multi-process run gathers them)
        rolled = self._rollout_prompts(prompts, self._config.group_size, key=key, keys=draw.keys)
        draw.tally["time/rollout"] += time.perf_counter() - start
        groups = groups_of_rollout(prompts, rolled, group_size=self._config.group_size, version=self._sampling_version(),
                                   tally=draw.tally)
        return dataclasses.replace(groups, routing=self._replayed_routing(rolled.completions.routing))

    def _replayed_routing(self, routing: Any) -> np.ndarray | None:
        """The rollout's routing to keep with the rows: with algorithm.routing_replay = rollout, the
        engine's record (refused when it has none), else None."""
        if self._config.routing_replay == "off":
            return None
        if routing is None:
            raise ValueError("algorithm.routing_replay=rollout: the rollout engine recorded no routing (a dense "
                             "model, or an engine or episode runner that does not record it; the static and paged "
                             "engines record a mixture of experts'); set algorithm.routing_replay=off")
        return np.asarray(routing, np.int32)

    def _score(self, groups: Groups, draw: KeysAndTally | None = None) -> Groups:
        """Fill in rewards with the reward manager (rl_core.learner.collection.score_groups)."""
        return score_groups(groups, self.reward_manager, step=self.step + 1, tally=(draw or KeysAndTally()).tally)

    def _record_behaviour_logprobs(self, groups: Groups) -> Groups:
        """`groups` with the current policy's log-probs filled in for rows that lack them (a rewritten
        history's earlier segments too): call at collection time, before any update (these are the
        log-probs of the policy that sampled the rows). With async rollouts it records nothing:
        `passes.at_collection` decides."""
        segments = groups.segments  # a rewritten history's earlier segments: theirs too
        missing = groups.missing_old_logp()
        if segments is not None and segments.missing_old_logp():
            missing = np.concatenate([missing, [True]])
        if not self._passes.at_collection(missing):
            return groups
        old = self._behaviour_logprobs(groups.prompt_tokens, groups.prompt_mask, groups.completion_tokens,
                                       recorded=groups.old_logp, completion_mask=groups.completion_mask,
                                       routing=groups.routing)
        if segments is not None and segments.missing_old_logp():
            segments = dataclasses.replace(segments, old_logp=np.asarray(self._behaviour_logprobs(
                segments.prompt_tokens, segments.prompt_mask, segments.completion_tokens, recorded=segments.old_logp,
                completion_mask=segments.completion_mask), np.float32))
        return dataclasses.replace(groups, old_logp=old, segments=segments)

    # -- the policy's passes, as the collection and the training half run them --------------------

    def _rollout_prompts(self, prompts: Sequence[Prompt], num_samples: int, *, key: jax.Array | None = None,
                         keys: Callable[[], jax.Array] | None = None) -> Rollout:
        """`num_samples` completions (or with `rollout.environment` episodes) of each prompt, prompt-major."""
        backend = self.generator.backend
        generate = self._generate if keys is None else functools.partial(self._generate, keys=keys)
        return collect_rollout(generate, self.tokenizer, self.rollout, prompts, num_samples, key=key,
                               row_limits=backend.capabilities.row_limits,
                               sessions=backend if backend.capabilities.retains else None)

    def _sampling_version(self) -> int:
        """The step count of the weights `_generate` samples with: the pinned ones' (a collection ahead), else the step's."""
        pinned = self.generator.pinned
        return self.step if pinned is None else pinned

    def _logprobs(self, params: Any, example: TrainExample, name: str = POLICY) -> jax.Array:
        """[B, T] log-probs of the example's completions under the policy's `params`."""
        if self._meter is not None:
            self._meter.scored(name, example)
        return self._logprob_pass(params, example)[0]

    def _behaviour_logprobs(self, prompt_tokens: Any, prompt_mask: Any, completion_tokens: Any, *,
                            recorded: np.ndarray | None = None, completion_mask: Any = None,
                            routing: Any = None) -> np.ndarray:
        """[B, T] float32 log-probs of completions under the current parameters, on the host
        (`PolicyLogprobs.behaviour`; `routing`: a mixture of experts' rollout routing, replayed);
        call at collection time, before any update on these rows."""
        return self._logprob_pass.behaviour(self.params, prompt_tokens, prompt_mask, completion_tokens,
                                            recorded=recorded, completion_mask=completion_mask, routing=routing)

    # -- the training half: examples under the current weights ------------------------------------

    def _examples_from(self, groups: Groups) -> StepBatch:
        tally = {"time/rollout": 0.0, "time/reward": 0.0}
        # and what reward functions reported about their calls (e.g. a judge model's time/judge)
        tally |= {k: v for k, v in groups.info.items() if k.startswith(("time/", "rewards/"))}
        example = self._example_from_groups(groups, tally)  # adds time/logprob
        adv = example.advantages[: len(groups.rewards)]  # the episodes' (segment rows repeat them)
        metrics = {**self._group_metrics(groups, adv), **tally, **records.collection_metrics(groups, step=self.step)}
        tokens = int(groups.info.get("perf/generated_tokens", 0.0))
        return StepBatch(example, metrics, self._samples(groups, adv), tokens)

    def _example_from_groups(self, groups: Groups, tally: dict[str, float] | None = None) -> TrainExample:
        """What one update needs from scored groups: advantages, arrays and log-probs (their
        seconds in `tally`, as time/logprob)."""
        example = self._to_example(groups, self._compute_advantages(groups))
        if groups.segments is not None:  # rewritten histories' earlier segments, with their episode's advantage
            rows = self.layout.rows_for(len(groups.rewards) + len(groups.segments))
            example = expand(example, groups.segments, rows, pad_id=self.tokenizer.pad_id)
        start = time.perf_counter()
        example = self._add_logprobs(example)
        if tally is not None:
            tally["time/logprob"] = time.perf_counter() - start
        return example

    def _compute_advantages(self, groups: Groups) -> np.ndarray:
        """The configured estimator on the groups' total rewards; one that reads each reward
        function's scores (GDPO, `takes_reward_scores`) also gets them [K, B] and their weights [K]."""
        estimator = registry.get(self._config.estimator_category, self._config.advantage_estimator)
        if takes_reward_scores(estimator) and groups.reward_scores:
            names = list(groups.reward_scores)
            weights = self._reward_weights()
            unweighted = [name for name in names if name not in weights]
            if unweighted:
                raise ValueError(f"advantage_estimator {self._config.advantage_estimator!r} weighs each reward "
                                 f"function's scores, but the reward manager has no weight for {unweighted}")
            scores = np.stack([np.asarray(groups.reward_scores[name], np.float32) for name in names])
            w = np.asarray([weights[name] for name in names], np.float32)
            return np.asarray(self._advantages(groups.rewards, self._config.group_size, scores=scores, weights=w))
        return np.asarray(self._advantages(groups.rewards, self._config.group_size))

    def _reward_weights(self) -> dict[str, float]:
        return {spec.name: spec.weight for spec in getattr(self.reward_manager, "specs", ())}

    def _to_example(self, groups: Groups, advantages: np.ndarray) -> TrainExample:
        mask = groups.completion_mask
        if self._config.mask_truncated_completions:
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
            routing=groups.routing,
        )

    def _add_logprobs(self, example: TrainExample) -> TrainExample:
        """Behaviour log-probs when the update can be off-policy, truncated importance sampling
        is on, a KL penalty in the rewards reads them, or some rows already carry theirs
        (carried rows); reference log-probs only when beta != 0; the teacher's when distilling
        (`passes` decides). Runs before any update of the step, so the current policy is the one
        that sampled the rows without recorded log-probs."""
        run, recorded = self._passes.before_update(example.old_logp)
        if run:
            old = self._behaviour_logprobs(example.prompt_tokens, example.prompt_mask, example.completion_tokens,
                                           recorded=recorded, completion_mask=example.completion_mask,
                                           routing=example.routing)
            example = example._replace(old_logp=old)
        if self._passes.reference:
            example = example._replace(ref_logp=self._reference_logprobs(example))
        if self._passes.teacher:
            if self._meter is not None:
                self._meter.scored("teacher", example)
            example = example._replace(teacher_logp=self._teacher_pass(self._teacher.params, example)[0])
        return example

    def _reference_logprobs(self, example: TrainExample) -> jax.Array:
        return self._logprobs(self._ref_params, example)

    # -- reporting ------------------------------------------------------------------------

    def _group_metrics(self, groups: Groups, advantages: np.ndarray) -> dict[str, float]:
        """Metrics of the groups trained on (rl_core.learner.records), with the reward audit's."""
        metrics = records.group_metrics(groups, advantages)
        if self._reward_audit is not None:  # signs of reward hacking (rl_core.learner.reward_audit)
            metrics.update(self._reward_audit(step=self.step + 1, **records.audit_inputs(groups, self._reward_weights())))
        return metrics

    def _samples(self, groups: Groups, advantages: np.ndarray) -> list[dict[str, Any]]:
        step = self.step + 1  # the step being produced: samples.jsonl records it after the counter advances
        ids = [f"step{step}/prompt{i}/sample{j}" for i in range(groups.num_groups) for j in range(self._config.group_size)]
        return records.samples(groups, advantages, ids)
