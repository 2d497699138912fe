"""The base RL learner: the loop every algorithm shares.

It owns data iteration, repeating a batch `num_iterations` times, mini-batches
(one optimizer step each) and micro-batches (exact gradient accumulation of
(sum, denominator) pairs), the jitted update with donated buffers and a guard
against non-finite and empty updates, metrics, evaluation on a schedule and
Orbax checkpoints with exact resume. An algorithm fills the abstract hooks.

Precision. The learner trains float32 master weights with float32 optimizer
state and float32 gradients, whatever dtype the policy stores its parameters
in; the policy's compute dtype (e.g. bfloat16 activations and matmuls) is its
own business. A float32 update is never rounded onto bfloat16 parameters.

The behaviour-policy contract. Every example carries `old_logp`, the
log-probs of the policy that generated its tokens, computed by the learner's
own forward pass (`behaviour_logprobs`) at collection time, whenever the update
can be off-policy:
  - more than one pass over the batch (num_iterations > 1),
  - more than one mini-batch (the policy moves between optimizer steps), or
  - rows carried over from an earlier step (they keep the log-probs recorded
    when they were collected, checkpoints included).
Only when a step is provably on-policy (one pass, one mini-batch, no carried
rows) may `old_logp` be None, and the loss then uses stop_gradient(logp),
which is exactly equal in value. `update_is_off_policy` states the first two
conditions; an algorithm that carries rows records their log-probs itself.

Adapters. A policy holding `nnx.LoRAParam`s (LoRA, see rl_core.frozen) trains
only them: `params`, the optimizer state and checkpoints hold the adapters, and
the base is `frozen`, placed once on the mesh and passed to every program
without being copied or donated.
"""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rl_core import frozen as frozen_lib
from rl_core import mesh as mesh_lib
from rl_core import multihost
from rl_core.checkpoint import Checkpointer
from rl_core.config import AlgorithmConfig, RolloutConfig, TrainingConfig
from rl_core.data import Prompt, PromptDataset, PromptStream
from rl_core.episodes.rollout import rollout_prompts as episode_rollout
from rl_core.episodes.runner import Rollout
from rl_core.faults import fault_point
from rl_core.files import keep_records_through
from rl_core.logprobs import completion_logprobs
from rl_core.metrics import MetricsLogger
from rl_core.optim import make_optimizer
from rl_core.progress import ProgressBar
from rl_core.rollout.backend import Requests
from rl_core.rollout.factory import make_backend
from rl_core.sampler import Completions, Sampler, SamplingParams
from rl_core.sinks import MetricsSink, WandbSink, samples_markdown
from rl_core.tokens import Tokenizer, decode_completions, encode_prompts
from rl_core.trim import trim_example, trimmed_width
from rl_core.types import TrainExample

ConfigT = TypeVar("ConfigT", bound=AlgorithmConfig)


class LossOutput(NamedTuple):
    """What `compute_loss` returns for one micro-batch: sums, never means."""

    total: jax.Array  # scalar numerator of the aggregated loss
    denom: jax.Array  # scalar denominator (independent of parameters)
    means: Mapping[str, tuple[jax.Array, jax.Array]] = {}  # name -> (sum, count)
    maxima: Mapping[str, jax.Array] = {}
    minima: Mapping[str, jax.Array] = {}


class StepBatch(NamedTuple):
    """What `produce_examples` returns: the batch plus what to log about it."""

    example: TrainExample
    metrics: Mapping[str, float]
    samples: Sequence[Mapping[str, Any]] = ()
    generated_tokens: int = 0


class NonFiniteUpdateError(RuntimeError):
    """A non-finite loss or gradient with `on_nonfinite='stop'`, or `max_skipped_in_a_row` of them."""


def _master_copy(x: jax.Array) -> jax.Array:
    """A float32 copy of a floating parameter (other leaves copied as they are).

    Copied: the update donates its buffers, and the caller's module must stay valid.
    """
    dtype = jnp.float32 if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
    return jnp.array(x, dtype=dtype, copy=True)


@jax.jit
def _split_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(next carried key, key to use): the values of `jax.random.split`, in one small program
    where the eager split and the unpacking of its result compile and dispatch two."""
    carried, used = jax.random.split(key)
    return carried, used


def data_mesh(devices: Sequence[jax.Device] | None = None) -> Mesh:
    """A mesh of pure data parallelism over `devices` (default: all): parameters replicated."""
    return mesh_lib.make_mesh(data=-1, fsdp=1, tensor=1, devices=devices)


class RLLearner(abc.ABC, Generic[ConfigT]):
    """Base learner; subclasses fill `produce_examples`, `compute_loss`,
    `num_iterations`, `group_size` and `trajectory_ids`."""

    def __init__(
        self,
        config: ConfigT,
        *,
        policy: nnx.Module,
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
    ) -> None:
        self.config = config
        self.training = training
        self.rollout = rollout
        self.tokenizer = tokenizer
        self.reward_manager = reward_manager
        self.eval_fn = eval_fn
        self.eval_every_steps = eval_every_steps  # 0: `eval_fn` never runs on a schedule
        self.mesh = mesh or mesh_lib.make_mesh(**training.mesh.to_dict())
        # in a multi-process run, process 0 alone writes files and shows progress
        self.writes = multihost.is_primary()
        self.progress = progress and self.writes
        self.batch_size = training.prompts_per_step * self.group_size
        self.num_mini_batches, self.num_micro_batches = training.batch_layout(self.batch_size)
        self._check_divisible_by_devices()

        if rollout.top_k > policy.vocab_size:
            raise ValueError(f"RolloutConfig.top_k = {rollout.top_k}: must be <= the policy's vocab_size ({policy.vocab_size})")
        self.graphdef, params, frozen, rest = frozen_lib.split_policy(policy)
        if jax.tree.leaves(rest):
            raise TypeError("the policy holds state other than nnx.Param; rl_core trains Param-only modules")
        # A plain dict of arrays (nnx.merge takes it), not nnx.Variables: each jitted call
        # rebuilds its output trees, and rebuilding ~150 Variables per step takes host time
        # that a small CPU's compute threads feel (~4 ms of an 80 ms tiny-qwen2 step).
        # Each parameter's layout comes from its logical axis names through mesh.RULES.
        self.param_shardings = nnx.to_pure_dict(mesh_lib.param_shardings(params, self.mesh))
        # The frozen base (empty without adapters) keeps its storage dtype; placing arrays that
        # already sit in their shardings (the trainer builds them so) copies nothing.
        self.frozen_shardings = nnx.to_pure_dict(mesh_lib.param_shardings(frozen, self.mesh))
        self.frozen = jax.device_put(nnx.to_pure_dict(frozen), self.frozen_shardings)
        self.policy_shardings = frozen_lib.join(self.param_shardings, self.frozen_shardings)
        # Float32 master weights (the policy casts them to its compute dtype where used),
        # copied inside one program that writes each shard where it belongs.
        self.params = jax.jit(lambda p: jax.tree.map(_master_copy, p), out_shardings=self.param_shardings)(
            nnx.to_pure_dict(params)
        )
        total_updates = training.num_steps * self.num_iterations * self.num_mini_batches
        self.tx = make_optimizer(training, total_updates)
        # optimizer moments shard like their parameters; counters are replicated
        self.opt_shardings = optax.tree_map_params(
            self.tx, lambda _, sharding: sharding, jax.eval_shape(self.tx.init, self.params), self.param_shardings,
            transform_non_params=lambda _: mesh_lib.replicated(self.mesh),
        )
        self.opt_state = jax.jit(self.tx.init, out_shardings=self.opt_shardings)(self.params)
        # on the mesh, replicated: every process splits the same key the same way
        self.rng = multihost.to_global(jax.random.PRNGKey(rollout.seed), mesh_lib.replicated(self.mesh))
        self.data = PromptStream(train_data, seed=training.seed)
        self.step = 0
        self.skipped_updates = 0  # non-finite loss or gradient
        self.skipped_in_a_row = 0  # against training.max_skipped_in_a_row
        self.empty_updates = 0  # mini-batches with no token in the loss
        self._stop_requested = False

        self.sampler = Sampler(
            self.graphdef, max_new_tokens=rollout.max_new_tokens, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id,
            mesh=self.mesh, param_shardings=self.policy_shardings,
        )
        # what `generate` samples with (rollout.engine); it gets the weights on the first
        # rollout after they change, stamped with the step as their version
        self.rollout_backend = make_backend(
            rollout, self.graphdef, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id, mesh=self.mesh,
            param_shardings=self.policy_shardings, batch_size=self.batch_size, sampler=self.sampler, policy=policy,
        )
        self._rollout_weights_of: Any = None
        whole = mesh_lib.replicated(self.mesh)
        # traced under the mesh's activation layout: rows split, weights gathered (rl_core.mesh)
        self._update = jax.jit(
            mesh_lib.with_activation_layout(self.mesh, self._update_fn),
            donate_argnums=(0, 1),  # never the frozen base (argument 2)
            in_shardings=(self.param_shardings, self.opt_shardings, self.frozen_shardings, self._row_sharding(axis=1)),
            out_shardings=(self.param_shardings, self.opt_shardings, whole),
        )
        self._logprobs = jax.jit(
            mesh_lib.with_activation_layout(self.mesh, self._logprobs_fn),
            in_shardings=(self.param_shardings, self.frozen_shardings, *(self._row_sharding(axis=1),) * 3),
            out_shardings=self._row_sharding(),
        )

        # the run folder (metrics, samples, checkpoints); None keeps nothing on disk
        out = Path(output_dir) if output_dir is not None else None
        self.output_dir = out
        self.logger = MetricsLogger(out if self.writes else None, tensorboard="tensorboard" in training.loggers)
        # the run's resolved settings (by default this learner's configs), recorded by the loggers
        run_config = dict(run_config) if run_config is not None else self._own_config()
        self.logger.write_text("config", "```\n" + json.dumps(run_config, indent=2) + "\n```", 0)
        self.sinks: list[MetricsSink] = []
        if "wandb" in training.loggers and out is not None and self.writes:  # a learner without a run folder logs nowhere
            name = "/".join(out.absolute().parts[-2:]) if out is not None else None
            self.sinks.append(WandbSink(out, config=run_config, name=name))
        self.checkpointer = (
            Checkpointer(out / "checkpoints", max_to_keep=training.max_checkpoints_to_keep) if out else None
        )

    # -- hooks an algorithm fills -------------------------------------------------------

    @abc.abstractmethod
    def produce_examples(self, prompts: Sequence[Prompt]) -> StepBatch:
        """Turn a batch of prompts into train examples with advantages."""

    @abc.abstractmethod
    def compute_loss(self, model: nnx.Module, example: TrainExample) -> LossOutput:
        """The loss of one micro-batch as (sum, denominator) plus metric sums (traced)."""

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

    def extra_state(self) -> dict[str, Any]:
        """JSON-serializable algorithm state to checkpoint (e.g. carried-over groups)."""
        return {}

    def load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Restore what `extra_state` returned."""

    # -- services for subclasses ----------------------------------------------------------

    def next_key(self) -> jax.Array:
        self.rng, key = _split_key(self.rng)
        return key

    def encode_prompts(self, prompts: Sequence[Prompt]) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded prompt tokens and mask [len(prompts), P] (sample each with `generate(num_samples=...)`)."""
        return encode_prompts(self.tokenizer, [p.text for p in prompts], max_tokens=self.rollout.max_prompt_tokens)

    def generate(
        self,
        prompt_tokens: np.ndarray,
        prompt_mask: np.ndarray,
        sampling: SamplingParams | None = None,
        *,
        num_samples: int = 1,
    ) -> Completions:
        """Sample `num_samples` completions per prompt row with the current parameters.

        Row i * num_samples + j is sample j of prompt i; each prompt is prefilled once.
        """
        sampling = sampling or SamplingParams.from_rollout(self.rollout)
        if self._rollout_weights_of is not self.params:  # new parameters since the last rollout
            self.rollout_backend.update_weights(self.policy_params(), self.step)
            self._rollout_weights_of = self.params
        requests = Requests(prompt_tokens, prompt_mask, num_samples)
        return self.rollout_backend.generate(requests, sampling, self.next_key())

    # -- the rollout hook: how a step turns prompts into completions (or episodes) -------------

    def rollout_prompts(self, prompts: Sequence[Prompt], num_samples: int) -> Rollout:
        """`num_samples` completions of each prompt on the host, rows prompt-major: one generation
        each, or with `rollout.environment` whole multi-turn episodes (rl_core.episodes)."""
        return episode_rollout(self.generate, self.tokenizer, self.rollout, prompts, num_samples)

    def policy_params(self, params: Any = None) -> dict[str, Any]:
        """The whole policy's parameters (trained `params`, default the current ones, joined
        with the frozen base) as one tree, as the sampler and `nnx.merge` take them."""
        return frozen_lib.join(self.params if params is None else params, self.frozen)

    def reference_params(self, policy: nnx.Module) -> Any:
        """Trained-parameter values that make the reference policy (the initial one).

        With adapters it is the base with adapters off: all-zero adapters (their term is then
        exactly zero) over the same frozen base, so no second copy of the weights exists.
        Without, the caller's initial Params (their storage dtype; never donated, so not copied).
        """
        if self.frozen:
            zeros = lambda p: jax.tree.map(jnp.zeros_like, p)  # noqa: E731
            return jax.jit(zeros, out_shardings=self.param_shardings)(self.params)
        return self.place_params(nnx.to_pure_dict(nnx.state(policy, nnx.Param)))

    def compute_logprobs(self, params: Any, example: TrainExample) -> tuple[jax.Array, jax.Array]:
        """(logp, entropy) [B, T] of the example's completions under `params` (0 past the
        trimmed width, see rl_core.trim)."""
        return self._micro_batched_logprobs(params, example.prompt_tokens, example.prompt_mask,
                                            example.completion_tokens, mask=example.completion_mask)

    def _micro_batched_logprobs(self, params: Any, prompt_tokens: Any, prompt_mask: Any,
                                completion_tokens: Any, *, mask: Any = None) -> tuple[jax.Array, jax.Array]:
        """(logp, entropy) [B, T], rows split over (data, fsdp) and run one micro-batch
        (the update's size) at a time, so the pass holds the activations the update holds.
        With the completion `mask`, the pass runs at the trimmed width and pads with zeros."""
        t = completion_tokens.shape[1]
        width = t if mask is None else trimmed_width(mask, self.rollout.logprob_chunk_tokens)
        if width < t:
            out = self._micro_batched_logprobs(params, prompt_tokens, prompt_mask, completion_tokens[:, :width])
            return jax.tree.map(lambda x: jnp.pad(x, ((0, 0), (0, t - width))), out)
        b = len(completion_tokens)
        micro = self.batch_size // (self.num_mini_batches * self.num_micro_batches)
        micro = micro if b % micro == 0 else b
        fields = (prompt_tokens, prompt_mask, completion_tokens)
        stacked = [np.asarray(x).reshape(b // micro, micro, *x.shape[1:]) for x in fields]
        return self._logprobs(params, self.frozen, *multihost.to_global(stacked, self._row_sharding(axis=1)))

    def update_is_off_policy(self) -> bool:
        """True when an update on a fresh batch can run on a policy other than the one that
        sampled it: several passes or several mini-batches (see the module docstring)."""
        return self.num_iterations > 1 or self.num_mini_batches > 1

    def behaviour_logprobs(
        self, prompt_tokens: Any, prompt_mask: Any, completion_tokens: Any, *, recorded: np.ndarray | None = None,
        completion_mask: Any = None,
    ) -> np.ndarray:
        """[B, T] float32 log-probs of completions under the current parameters, on the host.

        Call it at collection time, before any update on these rows: these are the
        behaviour policy's log-probs that the importance ratio divides by. Rows of
        `recorded` without NaN were recorded earlier (carried rows) and are kept as they are.
        With `completion_mask`, the pass runs at the trimmed width (0 beyond it).
        """
        logp, _ = self._micro_batched_logprobs(self.params, prompt_tokens, prompt_mask, completion_tokens,
                                               mask=completion_mask)
        fresh = np.asarray(multihost.to_host(logp), np.float32)
        if recorded is None:
            return fresh
        missing = np.isnan(recorded).any(axis=1)
        return np.where(missing[:, None], fresh, recorded).astype(np.float32)

    def decode(self, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
        """Completion texts (tokens under the mask, EOS dropped)."""
        return decode_completions(self.tokenizer, tokens, mask)

    @property
    def model(self) -> nnx.Module:
        """The current policy as an NNX module (a view for evaluation and export)."""
        return nnx.merge(self.graphdef, self.params, self.frozen)

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
                if self.checkpointer and every and self.step % every == 0:
                    self.save_checkpoint()
        if self.checkpointer and self.checkpointer.latest_step() != self.step:
            self.save_checkpoint()
        if self.checkpointer:
            self.checkpointer.wait()  # saves run in the background: on return, every checkpoint is on disk
        return self.logger.history

    def train_step(self) -> dict[str, Any]:
        """One step: prompts, examples, num_iterations passes of mini-batch updates, metrics."""
        start = time.perf_counter()
        prompts = self.data.next(self.training.prompts_per_step)
        batch = self.produce_examples(prompts)
        fault_point("step", self.step + 1)
        if batch.example.batch_size != self.batch_size:
            raise ValueError(
                f"produce_examples returned {batch.example.batch_size} completions, expected {self.batch_size}"
            )
        update_start = time.perf_counter()
        results = self.update(batch.example)
        if self.checkpointer is not None:
            # the previous step's checkpoint was written while this step ran; it is on disk
            # before this step's records are, so the files never run more than a step ahead
            self.checkpointer.wait()
        now = time.perf_counter()
        metrics = dict(batch.metrics)
        metrics.update(self._update_metrics(results))
        metrics["time/update"] = now - update_start
        metrics["time/step"] = now - start
        if batch.generated_tokens:
            metrics["perf/tokens_per_sec"] = batch.generated_tokens / max(now - start, 1e-9)
        self.step += 1
        every = self.eval_every_steps
        if self.eval_fn is not None and every and self.step % every == 0:
            metrics.update(self.eval_fn(self))
        if self.step % self.training.log_every_steps == 0:
            self.logger.write(self.step, metrics)
            for sink in self.sinks:
                sink.write(self.step, metrics)
        self._write_samples(batch.samples)
        return metrics

    def update(self, example: TrainExample) -> list[dict[str, Any]]:
        """`num_iterations` passes of one optimizer step per mini-batch over `example`.

        Returns each update's statistics on the host, in order (loss, grad_norm,
        finite, empty, and the algorithm's metric sums, maxima and minima).
        """
        # only the columns up to the longest completion (a bucketed width; see rl_core.trim)
        example = trim_example(example, trimmed_width(example.completion_mask, self.rollout.logprob_chunk_tokens))
        minis = self._mini_batches(example)
        results = []
        for _ in range(self.num_iterations):
            for mini in minis:
                self.params, self.opt_state, stats = self._update(self.params, self.opt_state, self.frozen, mini)
                results.append(stats)
        return multihost.to_host(results)

    def _update_metrics(self, results: list[dict[str, Any]]) -> dict[str, float]:
        empty = sum(int(r["empty"]) for r in results)
        skipped = sum(int(not r["finite"]) for r in results)
        self.skipped_updates += skipped
        self.empty_updates += empty
        if skipped and self.training.on_nonfinite == "stop":
            raise NonFiniteUpdateError(
                f"step {self.step + 1}: {skipped} of {len(results)} updates had a non-finite loss or gradient "
                f"(loss values {[float(r['loss']) for r in results]}); parameters were left unchanged. "
                "Lower the learning rate, check rewards and inputs, or set on_nonfinite='skip'."
            )
        for r in results:
            self.skipped_in_a_row = 0 if r["finite"] else self.skipped_in_a_row + 1
        limit = self.training.max_skipped_in_a_row
        if limit and self.skipped_in_a_row >= limit:
            raise NonFiniteUpdateError(
                f"step {self.step + 1}: the last {self.skipped_in_a_row} updates in a row had a non-finite loss or "
                "gradient and were skipped (training.max_skipped_in_a_row = "
                f"{limit}); check the model's weights, the rewards and the inputs, or lower the learning rate"
            )
        out: dict[str, float] = {
            "train/loss": float(np.mean([r["loss"] for r in results])),
            "train/grad_norm": float(np.mean([r["grad_norm"] for r in results])),
            "train/skipped_updates": float(skipped),
            "train/empty_updates": float(empty),
            "train/updates": float(len(results)),
        }
        for name in results[0]["means"]:
            total = sum(float(r["means"][name][0]) for r in results)
            count = sum(float(r["means"][name][1]) for r in results)
            out[name] = total / count if count else 0.0
        # extremes over the tokens trained on: an empty update has none (its +-inf is no value)
        trained = [r for r in results if not r["empty"]]
        for name in results[0]["maxima"] if trained else ():
            out[name] = max(float(r["maxima"][name]) for r in trained)
        for name in results[0]["minima"] if trained else ():
            out[name] = min(float(r["minima"][name]) for r in trained)
        return out

    # -- jitted pieces -------------------------------------------------------------------

    def _update_fn(self, params: Any, opt_state: Any, frozen: Any, batch: TrainExample) -> tuple[Any, Any, dict[str, Any]]:
        """One optimizer step over micro-batches stacked on axis 0 of every leaf."""
        grads, agg = self._summed_grads(params, frozen, batch)
        grads = jax.lax.with_sharding_constraint(grads, self.param_shardings)  # reduce-scattered, never whole
        empty = agg.denom <= 0  # no token in the loss: nothing to learn from
        denom = jnp.where(empty, 1.0, agg.denom)
        grads = jax.tree.map(lambda g: g / denom, grads)
        loss = agg.total / denom
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        def apply(state):
            params, opt_state = state
            updates, new_opt_state = self.tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), new_opt_state

        # A branch, not a select between old and new: the donated buffers update in place.
        # An empty mini-batch leaves parameters, optimizer state and schedule untouched
        # (AdamW would still move them through momentum and weight decay).
        new_params, new_opt_state = jax.lax.cond(finite & ~empty, apply, lambda state: state, (params, opt_state))
        stats = {
            "loss": loss,
            "grad_norm": grad_norm,
            "finite": finite,
            "empty": empty,
            "means": dict(agg.means),
            "maxima": dict(agg.maxima),
            "minima": dict(agg.minima),
        }
        return new_params, new_opt_state, stats

    def _summed_grads(self, params: Any, frozen: Any, batch: TrainExample) -> tuple[Any, LossOutput]:
        """Float32 gradients (of the trained parameters only) of the summed loss and the summed
        LossOutput over the stacked micro-batches."""

        def micro_loss(p, example):
            out = self.compute_loss(nnx.merge(self.graphdef, p, frozen), example)
            return out.total, out

        grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
        to_f32 = lambda tree: jax.tree.map(lambda x: x.astype(jnp.float32), tree)  # noqa: E731
        if jax.tree.leaves(batch)[0].shape[0] == 1:  # no loop (and no loop-carried copies) for one micro-batch
            (_, out), grads = grad_fn(params, jax.tree.map(lambda x: x[0], batch))
            return to_f32(grads), out

        (_, out_shape), grad_shape = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], batch))
        zeros = lambda tree: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)  # noqa: E731
        init = (
            # accumulate in float32 whatever the parameter dtype: many micro-batches add up
            jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), grad_shape),
            LossOutput(
                total=jnp.zeros(()),
                denom=jnp.zeros(()),
                means=zeros(dict(out_shape.means)),
                maxima={k: jnp.full(s.shape, -jnp.inf) for k, s in out_shape.maxima.items()},
                minima={k: jnp.full(s.shape, jnp.inf) for k, s in out_shape.minima.items()},
            ),
        )

        def body(acc, example):
            grads, agg = acc
            (_, out), g = grad_fn(params, example)
            agg = LossOutput(
                total=agg.total + out.total,
                denom=agg.denom + out.denom,
                means=jax.tree.map(jnp.add, dict(agg.means), dict(out.means)),
                maxima={k: jnp.maximum(agg.maxima[k], out.maxima[k]) for k in agg.maxima},
                minima={k: jnp.minimum(agg.minima[k], out.minima[k]) for k in agg.minima},
            )
            return (jax.tree.map(lambda acc, x: acc + x.astype(jnp.float32), grads, g), agg), None

        (grads, agg), _ = jax.lax.scan(body, init, batch)
        return grads, agg

    def _logprobs_fn(self, params, frozen, prompt_tokens, prompt_mask, completion_tokens):
        """(logp, entropy) [B, T] from micro-batches stacked on axis 0 [M, mb, ...], one at a time."""
        model = nnx.merge(self.graphdef, params, frozen)

        def one(xs):
            return completion_logprobs(
                model, *xs, temperature=self.rollout.temperature, chunk_tokens=self.rollout.logprob_chunk_tokens
            )

        out = jax.lax.map(one, (prompt_tokens, prompt_mask, completion_tokens))
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)

    # -- layout -------------------------------------------------------------------------

    def _mini_batches(self, example: TrainExample) -> list[TrainExample]:
        """Split [B, ...] into mini-batches of stacked micro-batches [M, mb, ...], sharded on mb.

        Host (numpy) fields are reshaped on the host and sent in one transfer per
        mini-batch; only fields already on the device take device ops.
        """
        n_mini, n_micro = self.num_mini_batches, self.num_micro_batches
        micro = self.batch_size // (n_mini * n_micro)

        def split(x):
            return None if x is None else x.reshape(n_mini, n_micro, micro, *x.shape[1:])

        stacked = TrainExample(*(split(x) for x in example))
        minis = [jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(n_mini)]
        return multihost.to_global(minis, self._row_sharding(axis=1))

    def _row_sharding(self, axis: int = 0) -> NamedSharding:
        """Split `axis` (the rows) over the mesh's (data, fsdp) axes."""
        return mesh_lib.rows(self.mesh, axis)

    def place_params(self, tree: Any) -> Any:
        """A params-shaped tree (e.g. reference weights) laid out like the parameters."""
        return jax.device_put(tree, self.param_shardings)

    def _check_divisible_by_devices(self) -> None:
        devices = mesh_lib.batch_devices(self.mesh)
        micro = self.batch_size // (self.num_mini_batches * self.num_micro_batches)
        if micro % devices:
            raise ValueError(
                f"micro-batches of {micro} completions cannot be split over {devices} devices (data x fsdp); "
                "choose prompts_per_step, group size and micro_batch_size so that it divides"
            )

    # -- checkpoints, samples -------------------------------------------------------------

    def _arrays(self) -> dict[str, Any]:
        return {"params": self.params, "opt_state": self.opt_state, "rng": self.rng}

    def save_checkpoint(self) -> None:
        if self.checkpointer is None:
            raise ValueError("no output_dir: nowhere to save a checkpoint")
        meta = {"step": self.step, "data_position": self.data.position, "extra": self.extra_state()}
        self.checkpointer.save(self.step, arrays=self._arrays(), meta=meta)

    def resume(self, log: Callable[[str], None] = print) -> bool:
        """Restore the newest checkpoint in the run folder that restores; True when one did.

        A damaged newer checkpoint is moved aside with one line in `log`. Records
        the killed run wrote past the restored step (metrics, samples, TensorBoard
        events, a line torn mid-write) are dropped, so each step is logged once.
        """
        if self.checkpointer is None:
            return False
        restored = self.checkpointer.restore_latest(like=self._arrays(), log=log)
        if restored is None:
            return False
        _, arrays, meta = restored
        self.params, self.opt_state, self.rng = arrays["params"], arrays["opt_state"], arrays["rng"]
        self.step = int(meta["step"])
        self.data.position = int(meta["data_position"])
        self.load_extra_state(meta.get("extra", {}))
        self.logger.truncate_after(self.step)
        if self.output_dir is not None and self.writes:
            keep_records_through(self.output_dir / "samples.jsonl", self.step)
        self.checkpointer.prune()
        return True

    def _write_samples(self, samples: Sequence[Mapping[str, Any]]) -> None:
        shown = list(samples[: self.training.samples_per_step])
        if not shown:
            return
        if not self.writes:
            return
        if self.output_dir is not None:
            with (self.output_dir / "samples.jsonl").open("a") as f:
                for sample in shown:
                    f.write(json.dumps({"step": self.step, **sample}) + "\n")
        self.logger.write_text("samples", samples_markdown(shown), self.step)
        for sink in self.sinks:
            sink.write_samples(self.step, shown)

    def _own_config(self) -> dict[str, Any]:
        return {"algorithm": self.config.to_dict(), "training": self.training.to_dict(), "rollout": self.rollout.to_dict()}

    def close(self) -> None:
        self.logger.close()
        for sink in self.sinks:
            sink.close()
        self.sinks = []
        if self.checkpointer is not None:
            self.checkpointer.close()
