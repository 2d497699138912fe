"""The base RL learner: the loop every algorithm shares, wired from parts with one job each.

  models     the trained models by name, each a `rl_core.train.trainable.TrainableModel`
             (frozen base, shardings, optimizer, one pure jitted update
             `(state, batch) -> (state, stats)`): "policy" always; an algorithm may add
             more (PPO's "critic")
  rollouts   the policy's sampler and rollout backend (`rl_core.rollout.generation`, rl_core.rollout)
  recorder   the run recorder (`rl_core.run.recorder`): metrics, samples, checkpoints
  layout     the mini- and micro-batch split on the mesh (`rl_core.train.layout`)

What a step changes is one value the learner holds, `state` (rl_core.learner.state.
LearnerState: each model's TrainState, the key, the step, the prompt stream's position,
the batches in flight, the algorithm's carry); `params`, `opt_state`, `rng`, `step`,
`in_flight`, ... read it. Only the learner replaces it, from what its parts return: a
collection returns its batch and the `Supply` past it (rl_core.data: position, carry,
key), async rollouts return the batches in flight (rl_core.rollout.async_rollout), a checkpoint
loads into a new value (rl_core.learner.state). Arrows run from the learner to its
parts, never back: no part takes the learner.

The learner owns data iteration, repeating a batch `num_iterations` times, evaluation
on a schedule and exact resume. An algorithm fills the abstract hooks: what a step
trains on, in two halves, `collect` (rollout and scoring; with async rollouts on the rollout
thread, with pinned weights) and `examples_from` (what the update needs, under the current
weights), and the policy's loss of one micro-batch (`loss_function`); `produce_examples` is the
two in line. For async rollouts (rl_core.rollout.async_rollout) it also gives the JSON form of a
collected batch for checkpoints (`batch_to_json`, `batch_from_json`); where `scores_apart`,
`collect` is cut once more (`collect_unscored`, `score_collected`) so that scoring runs on a
scoring thread.
rl_core.learner.pipeline.PolicyGradientLearner fills them with the pipeline every algorithm
package runs (sample, score, advantages, log-probs; the config in rl_core.pipeline_config).

The update path: `train_step` -> `update_models(example)` cuts the example into
mini-batches -> `models[name].update(state, mini)` (rl_core.train.trainable) -> the jitted
`make_update` -> `summed_grads` -> the algorithm's `loss_function()` (for the pipeline's
learners, rl_core.train.objective.policy_objective -> policy_gradient_loss).

Behaviour log-probs (`old_logp`, what the importance ratio divides by): see
rl_core.train.behaviour for when every example carries them.

Adapters. A policy holding `nnx.LoRAParam`s (LoRA, see rl_core.policy.frozen) trains only
them: `params`, the optimizer state and checkpoints hold the adapters, and the base is
`frozen`, placed once on the mesh and passed to every program, never copied or donated.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rl_core.runtime import mesh as mesh_lib
from rl_core.runtime import multihost
from rl_core.rollout.async_rollout import CollectHalves, RolloutThread, batch_ahead, settled, update_beside
from rl_core.train.behaviour import PolicyLogprobs
from rl_core.config import AlgorithmConfig, RolloutConfig, TrainingConfig
from rl_core.data import Prompt, PromptDataset, PromptStream, Supply
from rl_core.episodes.rollout import collect_rollout
from rl_core.episodes.runner import Rollout
from rl_core.run.faults import fault_point
from rl_core.rollout.generation import PolicyGenerator
from rl_core.train.layout import BatchLayout
from rl_core.runtime.mesh import data_mesh
from rl_core.learner.meter import Meter
from rl_core.learner.reward_audit import RewardAudit
from rl_core.learner.state import POLICY, LearnerState, load_state, state_arrays, state_meta
from rl_core.train.optim import make_optimizer
from rl_core.policy.protocols import PagedModel
from rl_core.run.progress import ProgressBar
from rl_core.run.recorder import RunRecorder
from rl_core.rollout.sampler import Completions, SamplingParams
from rl_core.policy.tokens import Tokenizer
from rl_core.train.trainable import LossFn, LossOutput, TrainableModel, TrainState
from rl_core.train.trim import trim_example, trimmed_width
from rl_core.types import StepBatch, TrainExample
from rl_core.train.update_stats import NonFiniteUpdateError, guard_updates, summarize

__all__ = ["LossOutput", "NonFiniteUpdateError", "RLLearner", "StepBatch", "data_mesh"]

ConfigT = TypeVar("ConfigT", bound=AlgorithmConfig)


@jax.jit
def _split_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(next carried key, key to use): the values of `jax.random.split`, in one small program
    where the eager split and the unpacking of its result compile and dispatch two."""
    carried, used = jax.random.split(key)
    return carried, used


class KeyStream:
    """A collection's own sampling keys: each call splits the key it holds (the values of
    `jax.random.split`, as the state's stream splits). A collection passes it down its steps as a
    value and leaves its last key in the supply it returns: nothing on a thread holds it, and a
    collection on the rollout thread never touches the learner's state."""

    def __init__(self, key: jax.Array) -> None:
        self.key = key

    def __call__(self) -> jax.Array:
        self.key, used = _split_key(self.key)
        return used


def _policy_attribute(name: str, doc: str | None = None) -> property:
    """The policy part's attribute `name`, read through the learner."""
    return property(lambda self: getattr(self.models[POLICY], name), doc=doc)


def _state_field(name: str, doc: str | None = None) -> property:
    """Field `name` of the learner's state, read-only (the learner replaces its state whole)."""
    return property(lambda self: getattr(self._state, name), doc=doc)


class RLLearner(CollectHalves, abc.ABC, Generic[ConfigT]):
    """Base learner; subclasses fill `collect`, `examples_from`, `loss_function`,
    `num_iterations`, `group_size` and `trajectory_ids` (and, for async rollouts, the JSON
    form of a collected batch, `CollectHalves.batch_to_json` / `batch_from_json`)."""

    extra_models: tuple[str, ...] = ()
    """Trained models beyond the policy, each a keyword argument of the constructor (PPO: "critic")."""

    def __init__(
        self,
        config: ConfigT,
        *,
        policy: nnx.Module,
        paging: PagedModel | None = None,
        tokenizer: Tokenizer,
        train_data: Sequence[Prompt] | PromptDataset,
        training: TrainingConfig,
        rollout: RolloutConfig,
        reward_manager: Any = None,
        eval_fn: Callable[[RLLearner], Mapping[str, float]] | None = None,
        eval_every_steps: int = 0,
        output_dir: str | Path | None = None,
        run_config: Mapping[str, Any] | None = None,
        mesh: Mesh | None = None,
        progress: bool = False,
        meter: Meter | None = None,
        reward_audit: RewardAudit | None = None,
    ) -> None:
        self.config, self.training, self.rollout, self.tokenizer = config, training, rollout, tokenizer
        self.reward_manager, self.eval_fn = reward_manager, eval_fn
        self.meter = meter  # told the rows each phase processes (rl_core.learner.meter), for a benchmark
        self.reward_audit = reward_audit  # told each step's rewards (rl_core.learner.reward_audit)
        self.eval_every_steps = eval_every_steps  # 0: `eval_fn` never runs on a schedule
        self.mesh = mesh or mesh_lib.training_mesh(training)
        # in a multi-process run, process 0 alone writes files and shows progress
        self.writes = multihost.is_primary()
        self.progress = progress and self.writes
        self.layout = BatchLayout(training, training.prompts_per_step * self.group_size, self.mesh, self.group_size)
        self.batch_size = self.layout.batch_size
        self.num_mini_batches, self.num_micro_batches = self.layout.num_mini_batches, self.layout.num_micro_batches

        if rollout.top_k > policy.vocab_size:
            raise ValueError(f"RolloutConfig.top_k = {rollout.top_k}: must be <= the policy's vocab_size ({policy.vocab_size})")
        self.models: dict[str, TrainableModel] = {}
        # everything a step changes, one value (rl_core.learner.state); on the mesh, replicated:
        # every process splits the same key the same way
        self._state = LearnerState(models={}, rng=multihost.to_global(jax.random.PRNGKey(rollout.seed),
                                                                      mesh_lib.replicated(self.mesh)))
        self.add_model(POLICY, policy, learning_rate=training.learning_rate, loss=self.loss_function)
        self.data = PromptStream(train_data, seed=training.seed)
        self._stop_requested = False
        # one-step-off-policy rollouts: where the batch ahead is collected
        if training.async_rollout != "off" and type(self).batch_to_json is CollectHalves.batch_to_json:
            raise ValueError(f"training.async_rollout = {training.async_rollout!r}: {type(self).__name__} has no "
                             "JSON form of a collected batch (batch_to_json / batch_from_json), which the "
                             "checkpoint of the batches in flight holds")
        self._ahead = RolloutThread.for_mode(training.async_rollout, scorers=training.max_staleness)
        if rollout.partial_rollouts != "off" and self._ahead is None:
            raise ValueError(f"rollout.partial_rollouts = {rollout.partial_rollouts!r}: needs "
                             "training.async_rollout='one_step' (a synchronous rollout never sees newer weights)")

        # `paging`: how the paged engine runs the policy (rl_core.policy.protocols.PagedModel; rollout.engine='paged' needs it)
        self.generator = PolicyGenerator(rollout, tokenizer, self.policy_part, batch_size=self.batch_size, module=policy,
                                       mesh=mesh_lib.rollout_mesh(training, self.mesh), paging=paging)
        self._logprob_pass = PolicyLogprobs(self.policy_part, rollout)
        self._logprobs = self._logprob_pass.program  # (logp, entropy) [B, T]

        # the run's resolved settings (by default this learner's configs), recorded with the run
        run_config = dict(run_config) if run_config is not None else self._own_config()
        self.recorder = RunRecorder(output_dir, training=training, run_config=run_config, writes=self.writes,
                                    progress=self.progress)
        self.output_dir = self.recorder.output_dir

    def add_model(self, name: str, module: nnx.Module, *, learning_rate: float,
                  loss: Callable[[], LossFn]) -> TrainableModel:
        """Train `module` as model `name`, with the run's optimizer at `learning_rate` and the loss
        `loss()` builds where it is first needed (the first update, or trainer plan's check)."""
        training = dataclasses.replace(self.training, learning_rate=learning_rate)
        total_updates = self.training.num_steps * self.num_iterations * self.num_mini_batches
        optimizer = make_optimizer(training, total_updates)
        self.models[name] = part = TrainableModel(module, name=name, optimizer=optimizer, loss=loss,
                                                  layout=self.layout)
        self._state = self._state.with_model(name, part.init_state(module))
        return part

    # -- hooks an algorithm fills -------------------------------------------------------

    @abc.abstractmethod
    def collect(self, prompts: Sequence[Prompt], supply: Supply) -> tuple[Any, Supply]:
        """The rollout half of a step: sample (through `generate`, which uses the pinned weights
        with async rollouts) and score; returns the batch and `supply` as the collection leaves it
        (more prompts drawn, the algorithm's carry, the key past its samples'). With async rollouts
        it runs beside the update: it must not read the trained parameters nor write what
        `examples_from` reads."""

    @abc.abstractmethod
    def examples_from(self, batch: Any) -> StepBatch:
        """The training half: what `collect` returned, as train examples under the current weights."""

    def produce_examples(self, prompts: Sequence[Prompt]) -> StepBatch:
        """The examples of `prompts` drawing on the current supply, the two halves in line
        (`train_step` keeps the supply they return; this keeps only the key its samples drew)."""
        batch, supply = self.collect(prompts, self.supply())
        self._state = self._state._replace(rng=supply.rng)
        return self.examples_from(batch)

    @abc.abstractmethod
    def loss_function(self) -> LossFn:
        """The policy's loss of one micro-batch, `fn(model, example) -> LossOutput` (sums and
        denominator plus metric sums, traced). Called once, where the policy's first update needs it
        (rl_core.train.trainable.TrainableModel.loss_fn): it may read the configs (`self.config`, `self.rollout`), never state that changes later, and the function it
        returns must be pure, as the jitted update closes over it."""

    @property
    @abc.abstractmethod
    def num_iterations(self) -> int:
        """How many times each batch is trained on."""

    @property
    @abc.abstractmethod
    def group_size(self) -> int:
        """Completions per prompt (G)."""

    @abc.abstractmethod
    def trajectory_ids(self, prompts: Sequence[Prompt]) -> list[str]:
        """One id per completion of `prompts` (for samples and debugging)."""

    def models_to_update(self) -> Sequence[str]:
        """The models this step's update trains, in order (default every one; PPO's critic
        warm-up trains the critic alone)."""
        return list(self.models)

    def carry_to_json(self, carry: Any) -> dict[str, Any]:
        """The algorithm's carry (LearnerState.carry, e.g. carried-over groups) as the JSON a
        checkpoint holds (its `extra`)."""
        return {}

    def carry_from_json(self, data: Mapping[str, Any]) -> Any:
        """The carry `carry_to_json` wrote (None by default)."""
        return None

    def extra_state(self) -> dict[str, Any]:
        """The current carry as a checkpoint holds it."""
        return self.carry_to_json(self._state.carry)

    # -- the state: one value, read here, replaced only by the learner ----------------------

    state = property(lambda self: self._state, doc="everything a step changes (rl_core.learner.state.LearnerState)")
    rng = _state_field("rng", "the training key stream's PRNG key")
    step = _state_field("step", "the steps done")
    data_position = _state_field("data_position", "the prompt stream's position")
    in_flight = _state_field("in_flight", "the batches collected ahead (async rollouts), oldest first")
    carry = _state_field("carry", "the algorithm's carry between steps (DAPO's surplus groups)")
    params = property(lambda self: self._state.models[POLICY].params, doc="the policy's trained parameters (float32 masters)")
    opt_state = property(lambda self: self._state.models[POLICY].opt_state, doc="the policy's optimizer state")

    def model_state(self, name: str) -> TrainState:
        """Trained model `name`'s (params, opt_state)."""
        return self._state.models[name]

    def replace_state(self, state: LearnerState | None = None, *, params: Any = None, opt_state: Any = None,
                      **fields: Any) -> None:
        """Take `state` (default the current one) with `fields` of LearnerState replaced, and the
        policy's `params` / `opt_state` when given: how a caller stages a scenario (a resume, a
        carried batch) without writing the learner's attributes."""
        state = (state or self._state)._replace(**fields)
        if params is not None or opt_state is not None:
            policy = state.models[POLICY]
            state = state.with_model(POLICY, TrainState(policy.params if params is None else params,
                                                        policy.opt_state if opt_state is None else opt_state))
        self._state = state

    def use_prompts(self, train_data: Sequence[Prompt] | PromptDataset, *, seed: int) -> None:
        """Draw prompts from `train_data` (epochs shuffled by `seed`) from its start on."""
        self.data = PromptStream(train_data, seed=seed)
        self._state = self._state._replace(data_position=0)

    def supply(self) -> Supply:
        """What the next collection draws on: the prompt stream at the state's position, the carry
        and the key."""
        return Supply(self.data, self._state.data_position, self._state.carry, self._state.rng)

    def _collect_supplied(self, prompts: Sequence[Prompt], supply: Supply, *, unscored: bool = False
                         ) -> tuple[Any, Supply]:
        """`collect(prompts, supply)`, or with `unscored` its generation half only (`collect_unscored`;
        `score_collected` scores it, on any thread): the batch and the supply past it, the key its
        samples were split from included."""
        return (self.collect_unscored if unscored else self.collect)(prompts, supply)

    def _publish_update(self) -> None:
        """The weights the update just made, W(step + 1), to the collection running beside it
        (`rollout.partial_rollouts`): its remaining tokens sample with them."""
        self.generator.publish(self._state.step + 1, self.params)

    def _take_supply(self, supply: Supply) -> None:
        """The state past a collection: the stream's position, the carry and the key it left."""
        self._state = self._state._replace(data_position=supply.position, carry=supply.carry, rng=supply.rng)

    # -- the policy part's attributes, as the learner's own -------------------------------------

    @property
    def policy_part(self) -> TrainableModel:
        return self.models[POLICY]

    graphdef, frozen = (_policy_attribute(name) for name in ("graphdef", "frozen"))
    policy_shardings = _policy_attribute("shardings", "the whole policy's shardings (trained and frozen)")
    sampler = property(lambda self: self.generator.sampler)  # the one-program sampler (evaluation uses it)
    rollout_backend = property(lambda self: self.generator.backend)

    # -- services for subclasses ----------------------------------------------------------

    def _next_key(self) -> jax.Array:
        """The state's training key stream's next key (a collection draws from its own `KeyStream`)."""
        rng, key = _split_key(self._state.rng)
        self._state = self._state._replace(rng=rng)
        return key

    def _sampling_version(self) -> int:
        """The step count of the weights `generate` samples with: the pinned ones' (a collection
        ahead), else the current step's."""
        pinned = self.generator.pinned
        return self.step if pinned is None else pinned

    def encode_prompts(self, prompts: Sequence[Prompt]) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded prompt tokens and mask [len(prompts), P] (sample each with `generate(num_samples=...)`)."""
        return self.generator.encode(prompts)

    def generate(self, prompt_tokens: np.ndarray, prompt_mask: np.ndarray, sampling: SamplingParams | None = None,
                 *, num_samples: int = 1, key: jax.Array | None = None, keys: Callable[[], jax.Array] | None = None,
                 max_new_tokens: np.ndarray | None = None, stop_strings: Sequence[Sequence[str]] | None = None,
                 sessions: np.ndarray | None = None) -> Completions:
        """Sample `num_samples` completions per prompt row with the current parameters (row
        i * num_samples + j is sample j of prompt i; each prompt is prefilled once), with the
        next key of `keys` (a collection's own stream, `KeyStream`) or else of the state's training
        stream, unless `key` is given (an evaluation must not draw from the stream, or evaluating
        would change the run). `max_new_tokens` / `stop_strings` (one per
        prompt row): where each row's samples end, on a backend with `row_limits` (the paged engine);
        `sessions` (one handle per row): sequences the backend keeps between calls (`Requests.sessions`)."""
        key = (keys or self._next_key)() if key is None else key
        out = self.generator.generate(prompt_tokens, prompt_mask, sampling, num_samples=num_samples, key=key,
                                     version=self.step, params=self.params, max_new_tokens=max_new_tokens,
                                     stop_strings=stop_strings, sessions=sessions)
        if self.meter is not None:
            self.meter.generated(prompt_mask, out.lengths, num_samples)
        return out

    # -- the rollout hook: how a step turns prompts into completions (or episodes) -------------

    def _rollout_prompts(self, prompts: Sequence[Prompt], num_samples: int, *, key: jax.Array | None = None,
                         keys: Callable[[], jax.Array] | None = None) -> Rollout:
        """`num_samples` completions of each prompt on the host, rows prompt-major: one generation
        each, or with `rollout.environment` whole multi-turn episodes (rl_core.episodes.rollout.collect_rollout);
        `key`: sample with it instead of a key stream; `keys`: the collection's own stream (else the
        state's)."""
        backend = self.rollout_backend
        generate = self.generate if keys is None else functools.partial(self.generate, keys=keys)
        return collect_rollout(generate, self.tokenizer, self.rollout, prompts, num_samples, key=key,
                               row_limits=backend.capabilities.row_limits,
                               sessions=backend if backend.capabilities.retains else None)

    def policy_params(self, params: Any = None) -> dict[str, Any]:
        """The whole policy's parameters (trained `params`, default the current ones, joined
        with the frozen base) as one tree, as the sampler and `nnx.merge` take them."""
        return self.policy_part.whole_params(self.params if params is None else params)

    def reference_params(self, policy: nnx.Module) -> Any:
        """Trained-parameter values that make the reference policy, the initial one (with adapters:
        all-zero adapters over the same frozen base, so no second copy of the weights exists)."""
        return self.policy_part.initial_params(policy, self.params)

    def compute_logprobs(self, params: Any, example: TrainExample) -> tuple[jax.Array, jax.Array]:
        """(logp, entropy) [B, T] of the example's completions under `params` (0 past the trimmed width)."""
        if self.meter is not None:
            self.meter.scored(POLICY, example)
        return self._logprob_pass(params, example)

    def behaviour_logprobs(self, prompt_tokens: Any, prompt_mask: Any, completion_tokens: Any, *,
                           recorded: np.ndarray | None = None, completion_mask: Any = None) -> np.ndarray:
        """[B, T] float32 log-probs of completions under the current parameters, on the host
        (`PolicyLogprobs.behaviour`). Call it at collection time, before any update on these rows."""
        return self._logprob_pass.behaviour(self.params, prompt_tokens, prompt_mask, completion_tokens,
                                           recorded=recorded, completion_mask=completion_mask)

    def decode(self, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
        """Completion texts (tokens under the mask, EOS dropped)."""
        return self.generator.decode(tokens, mask)

    @property
    def model(self) -> nnx.Module:
        """The current policy as an NNX module (a view for evaluation and export)."""
        return self.policy_part.module(self.params)

    def heldout_metrics(self, prompts: Sequence[Prompt]) -> dict[str, float]:
        """Algorithm-specific metrics on held-out prompts, added to each scheduled and final
        evaluation (PPO: the critic's explained variance); none by default. Must not draw from
        the training key stream (`_next_key`): evaluating would change the run."""
        return {}

    def request_stop(self) -> None:
        """Stop after the current step, with a checkpoint (e.g. on Ctrl-C)."""
        self._stop_requested = True

    # -- the loop -----------------------------------------------------------------------

    def train(self, num_steps: int | None = None) -> list[dict[str, Any]]:
        """Train until `num_steps` (default: the config's) steps are done; returns logged metrics."""
        target = num_steps if num_steps is not None else self.training.num_steps
        with ProgressBar(target, enabled=self.progress) as bar:
            bar.update(self.step, {})
            while self.step < target and not self._stop_requested:
                metrics = self.train_step()
                fault_point("logged", self.step)
                bar.update(self.step, metrics)
                every = self.training.checkpoint_every_steps
                if self.recorder.can_checkpoint and every and self.step % every == 0:
                    self.save_checkpoint()
        if self.recorder.can_checkpoint and self.recorder.latest_checkpoint() != self.step:
            self.save_checkpoint()
        self.recorder.wait()  # saves run in the background: on return, every checkpoint is on disk
        return self.recorder.history

    def train_step(self) -> dict[str, Any]:
        """One step: prompts, examples, num_iterations passes of mini-batch updates, metrics."""
        start = time.perf_counter()
        n, state = self.training.prompts_per_step, self._state
        if self._ahead is not None:  # async: the next batch is being collected from here to the update's end
            # scored apart where the collection allows it: its scoring runs on while later batches generate
            score = self.score_collected if self.scores_apart() else None
            batch, rest = batch_ahead(collect=self._collect_supplied, examples_from=self.examples_from,
                                      in_flight=state.in_flight, supply=self.supply(), prompts_per_step=n,
                                      version=state.step, params=self.params, generator=self.generator,
                                      thread=self._ahead, max_staleness=self.training.max_staleness, score=score)
        elif state.in_flight:  # an async run's checkpoint resumed synchronously: train on its batches first
            head = settled(state.in_flight[:1])[0]
            batch = self.examples_from(head.batch)
            batch = batch._replace(metrics={"rollout/staleness_version_lag": float(state.step - head.version),
                                            **batch.metrics})
            self._state = self._state._replace(in_flight=state.in_flight[1:])
        else:
            prompts, supply = self.supply().draw(n)
            collected, supply = self._collect_supplied(prompts, supply)
            self._take_supply(supply)
            batch = self.examples_from(collected)
        fault_point("step", self.step + 1)
        if self.layout.rows_for(batch.example.batch_size) != batch.example.batch_size:  # B, or whole micro-batches more
            if self._ahead is not None:
                self._ahead.abandon()
                self.generator.unpin()
            raise ValueError(
                f"examples_from returned {batch.example.batch_size} completions, expected {self.batch_size} (or more "
                f"in whole micro-batches: layout.rows_for)"
            )
        if self.meter is not None:
            self.meter.trained(batch.example, self.num_iterations)
        update_start = time.perf_counter()
        metrics = dict(batch.metrics)
        # steps between the weights that sampled the batch and the update's (async: batch_ahead's count)
        metrics.setdefault("rollout/staleness_version_lag", metrics.get("async/staleness", 0.0))
        if self._ahead is not None:
            (results, apart), in_flight, supply, waits = update_beside(
                self.run_updates, batch.example, rest=rest, generator=self.generator, thread=self._ahead,
                publish=self._publish_update if self.rollout.partial_rollouts != "off" else None)
            self._state = self._state._replace(in_flight=in_flight)
            if supply is not None:
                self._take_supply(supply)
            metrics.update(waits)
        else:
            results, apart = self.run_updates(batch.example)
        # the previous step's checkpoint was written while this step ran; it is on disk
        # before this step's records are, so the files never run more than a step ahead
        self.recorder.wait()
        now = time.perf_counter()
        metrics.update(self._update_metrics(results))
        metrics.update(apart)
        metrics["time/update"] = now - update_start
        metrics["time/step"] = now - start
        if batch.generated_tokens:
            metrics["perf/tokens_per_sec"] = batch.generated_tokens / max(now - start, 1e-9)
        self._state = self._state._replace(step=self._state.step + 1)
        if self.reward_audit is not None:  # what the audit carries to the next step, in the state
            self._state = self._state._replace(audit=self.reward_audit.state_json())
        every = self.eval_every_steps
        if self.eval_fn is not None and every and self.step % every == 0:
            metrics.update(self.eval_fn(self))
        if self.step % self.training.log_every_steps == 0:
            self.recorder.metrics(self.step, metrics)
        self.recorder.samples(self.step, batch.samples)
        return metrics

    def update_models(self, example: TrainExample) -> dict[str, list[dict[str, Any]]]:
        """`num_iterations` passes of one optimizer step per mini-batch over `example`, for each
        model of `models_to_update()` in turn on each mini-batch.

        Returns each model's update statistics on the host, in order (loss, grad_norm,
        finite, empty, and its loss's metric sums, maxima and minima).
        """
        return self.run_updates(example)[0]

    def run_updates(self, example: TrainExample) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
        """`update_models(example)` and, with a meter, the seconds of each model's updates but the
        policy's, timed apart (`time/<name>_update`)."""
        # only the columns up to the longest completion (a bucketed width; see rl_core.train.trim)
        example = trim_example(example, trimmed_width(example.completion_mask, self.rollout.logprob_chunk_tokens))
        minis = self.layout.mini_batches(example)
        names = list(self.models_to_update())
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        models = dict(self._state.models)
        # with a meter, each other model's updates are timed apart: wait for the work before and after them
        apart = {name: 0.0 for name in names if name != POLICY} if self.meter is not None else {}
        for _ in range(self.num_iterations):
            for mini in minis:
                for name in names:
                    if name in apart:
                        jax.block_until_ready(models)
                        start = time.perf_counter()
                    models[name], stats = self.models[name].update(models[name], mini)
                    if name in apart:
                        jax.block_until_ready(models[name])
                        apart[name] += time.perf_counter() - start
                    if self.meter is not None:
                        self.meter.updated(name, mini)
                    results[name].append(stats)
        self._state = self._state._replace(models=models)
        return multihost.to_host(results), {f"time/{name}_update": seconds for name, seconds in apart.items()}

    def _update_metrics(self, results: Mapping[str, list[dict[str, Any]]]) -> dict[str, float]:
        """Each model's updates summarised: the policy's as train/..., another's as <name>/...."""
        out: dict[str, float] = {}
        for name, stats in results.items():
            if stats:  # a model left out of this step (e.g. the policy in PPO's critic warm-up) has none
                counts = guard_updates(self._state.updates, self.training, self.step + 1,
                                       "updates" if name == POLICY else f"{name} updates", stats)
                self._state = self._state._replace(updates=counts)
                out.update(summarize(stats, "train/" if name == POLICY else f"{name}/"))
        return out

    # -- checkpoints ------------------------------------------------------------------------

    def checkpoint_arrays(self) -> dict[str, Any]:
        """The arrays a checkpoint holds (see rl_core.learner.state)."""
        return state_arrays(self._state)

    def save_checkpoint(self) -> None:
        # batches still being scored are waited for: the checkpoint holds them scored, as a resume needs
        self._state = self._state._replace(in_flight=settled(self._state.in_flight))
        meta = state_meta(self._state, carry_to_json=self.carry_to_json, batch_to_json=self.batch_to_json)
        self.recorder.save(self.step, arrays=state_arrays(self._state), meta=meta)

    def resume(self, log: Callable[[str], None] = print) -> bool:
        """Restore the newest checkpoint in the run folder that restores; True when one did.

        A damaged newer checkpoint is moved aside with one line in `log`; records the killed
        run wrote past the restored step are dropped (see rl_core.run.recorder).
        """
        restored = self.recorder.restore(like=state_arrays(self._state), log=log)
        if restored is not None:
            self._state = load_state(*restored, models=self.models, carry_from_json=self.carry_from_json,
                                     batch_from_json=self.batch_from_json)
            if self.reward_audit is not None:  # its streaks: a resumed run audits as if it had not stopped
                self.reward_audit.restore_json(self._state.audit or {})
        return restored is not None

    def _own_config(self) -> dict[str, Any]:
        return {"algorithm": self.config.to_dict(), "training": self.training.to_dict(), "rollout": self.rollout.to_dict()}

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
        self.recorder.close()

