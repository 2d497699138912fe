"""The base RL learner: one step, a short function over parts with one job each.

  models     the trained models by name (rl_core.train.trainable): "policy", PPO's "critic"
  generator  the policy's sampler and rollout backend (rl_core.rollout.generation)
  collector  where a batch is collected: now, or k steps ahead on a thread (rl_core.rollout.async_rollout)
  recorder   metrics, samples, checkpoints (rl_core.run.recorder)
  layout     the mini- and micro-batch split on the mesh (rl_core.train.layout)

`train_step`, top to bottom: the collector takes the step's batch (drawn from the `CollectionInputs`:
prompts, carry, key; collected in line, or k steps ago with pinned weights while this step
trains) through the algorithm's `_collection()`; `_examples_from` turns it into train examples
under the current weights; `run_updates` (rl_core.learner.updates) trains each model on it;
the collector hands back the queue in flight and the supply past it; the records are written.
Everything a step changes is one value, `state` (rl_core.learner.state.LearnerState), which only
the learner replaces, from what its parts return; no part takes the learner. The algorithm's
hooks are in rl_core.learner.hooks; rl_core.learner.pipeline.PolicyGradientLearner fills them.
With adapters (rl_core.policy.frozen) `params` are the adapters and the base is `frozen`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rl_core.config import AlgorithmConfig, RolloutConfig, TrainingConfig
from rl_core.data import CollectionInputs, Prompt, PromptDataset, PromptStream
from rl_core.learner.draw import split_key
from rl_core.learner.hooks import AlgorithmHooks
from rl_core.learner.meter import Meter
from rl_core.learner.reward_audit import RewardAudit
from rl_core.learner.state import POLICY, LearnerState, load_state, state_arrays, state_meta
from rl_core.learner.updates import run_updates, update_metrics
from rl_core.policy.protocols import PagedModel
from rl_core.policy.tokens import Tokenizer
from rl_core.rollout.async_rollout import Collector, await_scoring
from rl_core.rollout.generation import PolicyGenerator
from rl_core.rollout.sampler import Completions, SamplingParams
from rl_core.run.faults import fault_point
from rl_core.run.progress import ProgressBar
from rl_core.run.recorder import RunRecorder
from rl_core.runtime import mesh as mesh_lib
from rl_core.runtime import multihost
from rl_core.runtime.mesh import data_mesh
from rl_core.train.layout import BatchLayout
from rl_core.train.optim import make_optimizer
from rl_core.train.trainable import LossFn, LossOutput, TrainableModel
from rl_core.train.update_stats import NonFiniteUpdateError
from rl_core.types import StepBatch, TrainExample

__all__ = ["LossOutput", "NonFiniteUpdateError", "RLLearner", "StepBatch", "data_mesh"]

ConfigT = TypeVar("ConfigT", bound=AlgorithmConfig)


class RLLearner(AlgorithmHooks, Generic[ConfigT]):
    """Base learner; subclasses fill `_collect`, `_examples_from` and `_loss_function` (and, for
    async rollouts and a carry, a `_collection()` that names its batch type)."""

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
        self._config, self.training, self.rollout, self.tokenizer = config, training, rollout, tokenizer
        # told each step's rows, for a benchmark (rl_core.learner.meter), and rewards (rl_core.learner.reward_audit)
        self.reward_manager, self._meter, self._reward_audit = reward_manager, meter, reward_audit
        self._eval_fn, self._eval_every = eval_fn, eval_every_steps  # 0: never on a schedule
        mesh = mesh or mesh_lib.training_mesh(training)
        writes = multihost.is_primary()  # in a multi-process run, process 0 alone writes files and shows progress
        self.layout = BatchLayout(training, training.prompts_per_step * self._config.group_size, mesh, self._config.group_size)
        if rollout.top_k > policy.vocab_size:
            raise ValueError(f"RolloutConfig.top_k = {rollout.top_k}: must be <= the policy's vocab_size ({policy.vocab_size})")
        self.models: dict[str, TrainableModel] = {}
        # everything a step changes, one value; on the mesh, replicated: every process splits the same key the same way
        self._state = LearnerState(models={}, rng=multihost.to_global(jax.random.PRNGKey(rollout.seed),
                                                                      mesh_lib.replicated(mesh)))
        self._add_model(POLICY, policy, learning_rate=training.learning_rate, loss=self._loss_function)
        self._data, self._stop_requested = PromptStream(train_data, seed=training.seed), False
        # `paging`: how the paged engine runs the policy (rl_core.policy.protocols.PagedModel; rollout.engine='paged' needs it)
        # the policy's sampler and rollout backend (`.sampler`, `.backend`, `.encode` for prompts)
        self.generator = PolicyGenerator(rollout, tokenizer, self.models[POLICY], batch_size=self.layout.batch_size,
                                          module=policy, mesh=mesh_lib.rollout_mesh(training, mesh), paging=paging)
        self._collector = Collector.for_training(training, rollout, self.generator, learner=type(self).__name__,
                                                 saves_batches=self._collection().batch is not None)
        # the run's resolved settings (by default this learner's configs), recorded with the run
        run_config = dict(run_config) if run_config is not None else {
            "algorithm": config.to_dict(), "training": training.to_dict(), "rollout": rollout.to_dict()}
        self._progress = progress and writes
        self._recorder = RunRecorder(output_dir, training=training, run_config=run_config, writes=writes,
                                    progress=self._progress)

    def _add_model(self, name: str, module: nnx.Module, *, learning_rate: float,
                  loss: Callable[[], LossFn]) -> TrainableModel:
        """Train `module` as model `name`, with the run's optimizer at `learning_rate` and the loss
        `loss()` builds where it is first needed (the first update, or trainer plan's check)."""
        training = dataclasses.replace(self.training, learning_rate=learning_rate)
        total_updates = self.training.num_steps * self._config.num_iterations * self.layout.num_mini_batches
        self.models[name] = part = TrainableModel(module, name=name, optimizer=make_optimizer(training, total_updates),
                                                  loss=loss, layout=self.layout)
        self._state = self._state.with_model(name, part.init_state(module))
        return part

    # -- the state: one value, read here, replaced only by the learner ----------------------

    state = property(lambda self: self._state, doc="everything a step changes (rl_core.learner.state.LearnerState)")
    step = property(lambda self: self._state.step, doc="the steps done")
    params = property(lambda self: self._state.policy.params, doc="the policy's trained parameters (float32 masters)")

    def supply(self) -> CollectionInputs:
        """What the next collection draws on: the prompt stream at the state's position, the carry and the key."""
        return CollectionInputs(self._data, self._state.data_position, self._state.carry, self._state.rng)

    # -- the policy, as the sampler and evaluation see it -------------------------------------

    policy = property(lambda self: self.models[POLICY],
                      doc="the policy's part (rl_core.train.trainable.TrainableModel: graphdef, frozen base, shardings)")

    def policy_params(self, params: Any = None) -> dict[str, Any]:
        """The whole policy's parameters (trained `params`, default the current ones, joined
        with the frozen base) as one tree, as the sampler and `nnx.merge` take them."""
        return self.policy.whole_params(self.params if params is None else params)

    @property
    def model(self) -> nnx.Module:
        """The current policy as an NNX module (a view for evaluation and export)."""
        return self.models[POLICY].module(self.params)

    def _generate(self, prompt_tokens: np.ndarray, prompt_mask: np.ndarray, sampling: SamplingParams | None = None,
                 *, num_samples: int = 1, key: jax.Array | None = None, keys: Callable[[], jax.Array] | None = None,
                 max_new_tokens: np.ndarray | None = None, stop_strings: Sequence[Sequence[str]] | None = None,
                 sessions: np.ndarray | None = None) -> Completions:
        """`num_samples` completions per prompt row (row i * num_samples + j: sample j of prompt i), with
        `key`, else the next of `keys` (a collection's `KeyStream`), else of the state's stream.
        Per row: `max_new_tokens` / `stop_strings` (`row_limits`), `sessions` (kept between calls)."""
        if key is None and keys is None:
            rng, key = split_key(self._state.rng)
            self._state = self._state._replace(rng=rng)
        key = keys() if key is None else key
        out = self.generator.generate(prompt_tokens, prompt_mask, sampling, num_samples=num_samples, key=key,
                                       version=self.step, params=self.params, max_new_tokens=max_new_tokens,
                                       stop_strings=stop_strings, sessions=sessions)
        if self._meter is not None:
            self._meter.generated(prompt_mask, out.lengths, num_samples)
        return out

    # -- the loop -----------------------------------------------------------------------

    def train(self, num_steps: int | None = None) -> list[dict[str, Any]]:
        """Train until `num_steps` (default: the config's) steps are done; returns logged metrics."""
        target = num_steps if num_steps is not None else self.training.num_steps
        with ProgressBar(target, enabled=self._progress) as bar:
            bar.update(self.step, {})
            while self.step < target and not self._stop_requested:
                metrics = self.train_step()
                fault_point("logged", self.step)
                bar.update(self.step, metrics)
                every = self.training.checkpoint_every_steps
                if self._recorder.can_checkpoint and every and self.step % every == 0:
                    self._save_checkpoint()
        if self._recorder.can_checkpoint and self._recorder.latest_checkpoint() != self.step:
            self._save_checkpoint()
        self._recorder.wait()  # saves run in the background: on return, every checkpoint is on disk
        return self._recorder.history

    def request_stop(self) -> None:
        """Stop after the current step, with a checkpoint (e.g. on Ctrl-C)."""
        self._stop_requested = True

    def train_step(self) -> dict[str, Any]:
        """One step: the batch (collected now, or k steps ago beside earlier updates), its
        examples under the current weights, `config.num_iterations` passes of updates, the records."""
        start = time.perf_counter()
        state, collector = self._state, self._collector
        try:
            head, rest, supply, metrics = collector.take(self._collection(), state.in_flight, self.supply(),
                                                         version=state.step, params=self.params)
            batch = self._examples_from(head.batch)
            fault_point("step", state.step + 1)
            if self.layout.rows_for(batch.example.batch_size) != batch.example.batch_size:  # B, or whole micro-batches more
                raise ValueError(f"_examples_from returned {batch.example.batch_size} completions, expected "
                                 f"{self.layout.batch_size} (or more in whole micro-batches: layout.rows_for)")
            if self._meter is not None:
                self._meter.trained(batch.example, self._config.num_iterations)
            update_start = time.perf_counter()
            results, update_times = self._update(batch.example)
            publish = (state.step + 1, self.params) if self.rollout.partial_rollouts != "off" else None
            in_flight, supply, waits = collector.finish(rest, supply, publish=publish)
        except BaseException:
            collector.abandon()
            raise
        self._state = self._state._replace(in_flight=in_flight, data_position=supply.position, carry=supply.carry,
                                           rng=supply.rng)
        # the previous step's checkpoint was written while this step ran; it is on disk
        # before this step's records are, so the files never run more than a step ahead
        self._recorder.wait()
        now = time.perf_counter()
        counts, trained = update_metrics(results, self._state.updates, self.training, state.step + 1)
        metrics = {**batch.metrics, **metrics, **waits, **trained, **update_times, "time/update": now - update_start,
                   "time/step": now - start}
        if batch.generated_tokens:
            metrics["perf/tokens_per_sec"] = batch.generated_tokens / max(now - start, 1e-9)
        audit = self._reward_audit.state_json() if self._reward_audit is not None else self._state.audit
        self._state = self._state._replace(step=state.step + 1, updates=counts, audit=audit)
        if self._eval_fn is not None and self._eval_every and self.step % self._eval_every == 0:
            metrics.update(self._eval_fn(self))
        if self.step % self.training.log_every_steps == 0:
            self._recorder.metrics(self.step, metrics)
        self._recorder.samples(self.step, batch.samples)
        return metrics

    def produce_examples(self, prompts: Sequence[Prompt]) -> StepBatch:
        """A step's batch of `prompts` without its update (of the supply, only the key drawn is kept)."""
        batch, supply = self._collection().collect_scored(prompts, self.supply())
        self._state = self._state._replace(rng=supply.rng)
        return self._examples_from(batch)

    def update_models(self, example: TrainExample) -> dict[str, list[dict[str, Any]]]:
        """`config.num_iterations` passes of one optimizer step per mini-batch over `example`, for each model
        of `_models_to_update()` in turn; each model's update statistics on the host, in order."""
        return self._update(example)[0]

    def _update(self, example: TrainExample) -> tuple[dict[str, list[dict[str, Any]]], dict[str, float]]:
        models, results, update_times = run_updates(
            self.models, self._state.models, example, names=list(self._models_to_update()), meter=self._meter,
            iterations=self._config.num_iterations, layout=self.layout, chunk_tokens=self.rollout.logprob_chunk_tokens)
        self._state = self._state._replace(models=models)
        return results, update_times

    # -- checkpoints ------------------------------------------------------------------------

    def _save_checkpoint(self) -> None:
        # batches still being scored are waited for: the checkpoint holds them scored, as a resume needs
        self._state = self._state._replace(in_flight=await_scoring(self._state.in_flight))
        self._recorder.save(self.step, arrays=state_arrays(self._state), meta=state_meta(self._state))

    def resume(self, log: Callable[[str], None] = print) -> bool:
        """Restore the newest checkpoint in the run folder that restores; True when one did. A damaged
        newer one is moved aside with a line in `log`; records written past it are dropped."""
        restored = self._recorder.restore(like=state_arrays(self._state), log=log)
        if restored is not None:
            self._state = load_state(*restored, models=self.models, batch=self._collection().batch)
            if self._reward_audit is not None:  # its streaks: a resumed run audits as if it had not stopped
                self._reward_audit.restore_json(self._state.audit or {})
        return restored is not None

    def close(self) -> None:
        self._collector.close()
        self._recorder.close()
