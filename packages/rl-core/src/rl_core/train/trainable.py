"""One trained model: its frozen base, shardings, optimizer and one jitted update; not its state.

The learner trains one `TrainableModel` per model, by name (`policy`; PPO adds `critic`).
Each is made from an NNX module, an optax optimizer and the loss of one micro-batch. What
an update changes, the model's `TrainState` (float32 master weights of its trained
parameters, laid out by the mesh rules (rl_core.runtime.mesh) whatever dtype the module stores them
in, so a float32 update is never rounded onto bfloat16 parameters, and their optimizer
state), is a value the learner holds (rl_core.learner.state.LearnerState): the part makes the
first one (`init_state`) and turns one into the next (`update`). The part owns:

  - the frozen base (`frozen`, empty without adapters; see rl_core.policy.frozen), placed
    once and passed to every program, never copied or donated;
  - `update_step`, one jitted program `(state, frozen, batch) -> (state, stats)` (made where first
    needed, with the loss `loss()` builds then) with
    the state donated: exact gradient accumulation of (sum, denominator) pairs over
    the micro-batches stacked on axis 0 of the batch, one optimizer step, and a guard
    that leaves the state untouched on a non-finite or empty update;
  - its passes outside the update (`forward`: a policy's log-probs, a critic's values),
    cut into micro-batches like the update's batches (the `layout` it is given).

Its shardings (`model_shardings`), its update (`update_program`) and its passes
(`forward_program`) are functions of the module's split state, concrete or abstract, so that
`trainer plan` compiles these same programs, with these same layouts, on abstract arrays
(`abstract_model`) without allocating a weight.

The update is a pure function of its arguments: it closes over the graph definition, the
optimizer (pure functions), the loss function and the shardings, all fixed once made, and
over nothing a learner changes later. The loss, `loss_fn(model, example) -> LossOutput`, must be
pure too (see the algorithm packages: built once from the configs, when the first update or a
reader needs it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from rl_core.policy import frozen as frozen_lib
from rl_core.runtime import mesh as mesh_lib
from rl_core.train.layout import BatchLayout


class LossOutput(NamedTuple):
    """What a loss returns for one micro-batch: sums, never means."""

    total: jax.Array  # scalar numerator of the aggregated loss
    denom: jax.Array  # scalar denominator (independent of parameters)
    means: Mapping[str, tuple[jax.Array, jax.Array]] = {}  # name -> (sum, count)
    maxima: Mapping[str, jax.Array] = {}
    minima: Mapping[str, jax.Array] = {}


LossFn = Callable[[nnx.Module, Any], LossOutput]
"""loss_fn(model, example) -> LossOutput of one micro-batch (traced)."""


class TrainState(NamedTuple):
    """What an update changes (and donates): trained parameters and optimizer state."""

    params: Any
    opt_state: Any


def _master_copy(x: jax.Array) -> jax.Array:
    """A float32 copy of a floating parameter (other leaves copied as they are).

    Copied: the update donates its buffers, and the caller's module must stay valid.
    """
    return jnp.array(x, dtype=master_dtype(x.dtype), copy=True)


def master_dtype(dtype: Any) -> Any:
    """The dtype a trained parameter of `dtype` is kept in: float32 if floating, else its own."""
    return jnp.float32 if jnp.issubdtype(dtype, jnp.floating) else dtype


class ModelShardings(NamedTuple):
    """Where a trained model's arrays live on the mesh (pure dicts of NamedShardings)."""

    params: Any
    """Like the trained parameters (and their float32 masters and gradients)."""
    frozen: Any
    """Like the frozen base (empty without adapters)."""
    opt: Any
    """Like the optimizer state: moments as their parameters, counters replicated."""

    @property
    def state(self) -> TrainState:
        return TrainState(self.params, self.opt)

    @property
    def whole(self) -> Any:
        """The whole model's (trained and frozen joined): the tree `nnx.merge` and the samplers take."""
        return frozen_lib.join(self.params, self.frozen)


def model_shardings(params: nnx.State, frozen: nnx.State, optimizer: optax.GradientTransformation,
                    mesh: Mesh) -> ModelShardings:
    """The one place a trained model's shardings are computed, from its trained Params and frozen
    base as `frozen_lib.split_policy` splits them, concrete or abstract (`nnx.eval_shape`): each
    parameter's layout from its logical axis names through mesh.RULES (`mesh_lib.param_shardings`),
    the optimizer's moments like their parameters, its counters replicated. TrainableModel and
    `trainer plan` both take theirs from here."""
    param_shardings = nnx.to_pure_dict(mesh_lib.param_shardings(params, mesh))
    frozen_shardings = nnx.to_pure_dict(mesh_lib.param_shardings(frozen, mesh))
    masters = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, master_dtype(s.dtype)), nnx.to_pure_dict(params))
    opt_shardings = optax.tree_map_params(
        optimizer, lambda _, sharding: sharding, jax.eval_shape(optimizer.init, masters), param_shardings,
        transform_non_params=lambda _: mesh_lib.replicated(mesh),
    )
    return ModelShardings(param_shardings, frozen_shardings, opt_shardings)


def abstract_model(params: nnx.State, frozen: nnx.State, optimizer: optax.GradientTransformation,
                   shardings: ModelShardings) -> tuple[TrainState, Any]:
    """(state, frozen) of the TrainableModel these would make, as sharded ShapeDtypeStructs (nothing
    allocated): float32 master weights and their optimizer state, the frozen base in its storage
    dtype. What `trainer plan` compiles the model's programs on."""
    def placed(tree: Any, sharding: Any, dtype: Any = None) -> Any:
        return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, dtype(s.dtype) if dtype else s.dtype,
                                                               sharding=sh), tree, sharding)

    masters = placed(nnx.to_pure_dict(params), shardings.params, master_dtype)
    opt_state = placed(jax.eval_shape(optimizer.init, masters), shardings.opt)
    return TrainState(masters, opt_state), placed(nnx.to_pure_dict(frozen), shardings.frozen)


class TrainableModel:
    """A model the learner trains; see the module docstring."""

    def __init__(
        self,
        module: nnx.Module,
        *,
        name: str,
        optimizer: optax.GradientTransformation,
        loss: Callable[[], LossFn],
        layout: BatchLayout,
    ) -> None:
        """`loss`: builds the loss of one micro-batch, called once, where it is first needed."""
        self.name, self.layout = name, layout
        mesh = layout.mesh
        self.graphdef, params, frozen, rest = frozen_lib.split_policy(module)
        if jax.tree.leaves(rest):
            raise TypeError(f"the {name} holds state other than nnx.Param; rl_core trains Param-only modules")
        # Plain dicts of arrays (nnx.merge takes them), not nnx.Variables: each jitted call
        # rebuilds its output trees, and rebuilding ~150 Variables per step takes host time
        # that a small CPU's compute threads feel (~4 ms of an 80 ms tiny-qwen2 step).
        # Every layout comes from `model_shardings` (trainer.plan computes the same ones).
        self.model_shardings = model_shardings(params, frozen, optimizer, mesh)
        self.param_shardings, self.frozen_shardings = self.model_shardings.params, self.model_shardings.frozen
        self.opt_shardings = self.model_shardings.opt
        # The frozen base (empty without adapters) keeps its storage dtype; placing arrays that
        # already sit in their shardings (the trainer builds them so) copies nothing.
        self.frozen = jax.device_put(nnx.to_pure_dict(frozen), self.frozen_shardings)
        self.shardings = self.model_shardings.whole
        self.tx = optimizer
        self._loss = loss

    @functools.cached_property
    def loss_fn(self) -> LossFn:
        """The loss `update_step` differentiates (trainer plan compiles the same; tests hold them equal)."""
        return self._loss()

    @functools.cached_property
    def update_step(self) -> Callable[..., Any]:
        """The jitted update of `loss_fn`, traced under the mesh's activation layout: rows split,
        weights gathered (rl_core.runtime.mesh)."""
        return update_program(self.graphdef, self.tx, self.loss_fn, self.model_shardings, self.layout.mesh)

    def init_state(self, module: nnx.Module) -> TrainState:
        """The state training starts from: float32 master weights of `module`'s trained parameters
        (the module casts them to its compute dtype where used), copied inside one program that
        writes each shard where it belongs, and the optimizer's initial state."""
        _, params, _, _ = frozen_lib.split_policy(module)
        masters = jax.jit(lambda p: jax.tree.map(_master_copy, p), out_shardings=self.param_shardings)(
            nnx.to_pure_dict(params)
        )
        return TrainState(masters, jax.jit(self.tx.init, out_shardings=self.opt_shardings)(masters))

    def update(self, state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
        """One optimizer step over `batch` (micro-batches stacked on axis 0): the new state (`state`
        is donated) and its statistics (loss, grad_norm, finite, empty and the loss's metric sums,
        maxima and minima)."""
        return self.update_step(state, self.frozen, batch)

    def whole_params(self, params: Any) -> dict[str, Any]:
        """Trained `params` joined with the frozen base: the tree `nnx.merge(graphdef, ...)` and
        the samplers take."""
        return frozen_lib.join(params, self.frozen)

    def module(self, params: Any) -> nnx.Module:
        """The model with trained `params` as an NNX module (a view)."""
        return nnx.merge(self.graphdef, params, self.frozen)

    def place(self, tree: Any) -> Any:
        """A params-shaped tree laid out like the trained parameters."""
        return jax.device_put(tree, self.param_shardings)

    def initial_params(self, module: nnx.Module, params: Any) -> Any:
        """Trained-parameter values that give `module` as it was given (e.g. a reference policy),
        shaped like trained `params`.

        With adapters it is the base with adapters off: all-zero adapters (their term is then
        exactly zero) over the same frozen base, so no second copy of the weights exists.
        Without, the module's own Params (their storage dtype; never donated, so not copied).
        """
        if self.frozen:
            zeros = lambda p: jax.tree.map(jnp.zeros_like, p)  # noqa: E731
            return jax.jit(zeros, out_shardings=self.param_shardings)(params)
        return self.place(nnx.to_pure_dict(nnx.state(module, nnx.Param)))

    def forward(self, fn: Callable[..., Any], *, chunk_tokens: int, packs: bool = False,
                shares: bool = False) -> ForwardPass:
        """The pass `fn(model, prompt_tokens, prompt_mask, completion_tokens)` -> [B, T] outputs of
        this model (log-probs of a policy, values of a critic), run as the update runs its rows;
        one that `packs` is also given `packed=` the layout's packed rows (rl_core.train.packing), one
        that `shares` `shared=` each group's prompt once where the layout shares them (else None)."""
        return ForwardPass(self, fn, chunk_tokens=chunk_tokens, packs=packs, shares=shares)


class ForwardPass:
    """A model's jitted pass outside the update, over the layout's micro-batches.

    `pass_(params, prompt_tokens, prompt_mask, completion_tokens, *per_token, mask=...)` runs
    `fn(model, prompt_tokens, prompt_mask, completion_tokens, *per_token)` on one micro-batch at
    a time (so it holds the activations the update holds) with trained `params` and its frozen base; `per_token` are further [B, T] inputs (the critic's
    log-probs). With the completion `mask`, at the trimmed width (rl_core.train.trim, in multiples of
    `chunk_tokens`), zeros beyond it.
    """

    def __init__(self, part: TrainableModel, fn: Callable[..., Any], *, chunk_tokens: int, packs: bool,
                 shares: bool = False) -> None:
        self.part, self.chunk_tokens, self.packs, self.shares = part, chunk_tokens, packs, shares
        self.program = forward_program(part.graphdef, fn, part.model_shardings, part.layout.mesh, packs=packs,
                                       shares=shares)

    def __call__(self, params: Any, prompt_tokens: Any, prompt_mask: Any, completion_tokens: Any, *per_token: Any,
                 mask: Any = None) -> Any:
        return self.part.layout.micro_batched(self.program, params, self.part.frozen, prompt_tokens, prompt_mask,
                                              completion_tokens, *per_token, mask=mask, chunk_tokens=self.chunk_tokens,
                                              packs=self.packs, shares=self.shares)


def update_program(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, loss_fn: LossFn,
                   shardings: ModelShardings, mesh: Mesh) -> Any:
    """A TrainableModel's `update_step`: `make_update` jitted with the state donated (never the frozen
    base, argument 1), traced under the mesh's activation layout (rows split, weights gathered; see
    rl_core.runtime.mesh), the batch's micro-batches stacked on axis 0 and their rows split on axis 1."""
    state, rows = shardings.state, mesh_lib.rows(mesh, axis=1)
    return jax.jit(
        mesh_lib.with_activation_layout(mesh, typed_inputs(make_update(graphdef, optimizer, loss_fn, shardings.params),
                                                           rows)),
        donate_argnums=0,
        in_shardings=(state, shardings.frozen, rows),
        out_shardings=(state, mesh_lib.replicated(mesh)),
    )


def typed_inputs(fn: Callable[..., Any], rows: NamedSharding) -> Callable[..., Any]:
    """`fn(params, frozen, inputs)` with `inputs` constrained to `rows`, the layout the program takes them
    in (a no-op in the compiled program). Host arrays (one process) trace as arrays of no mesh where
    device arrays and the plan's abstract ones carry it; values of both kinds meeting in one op trace
    apart, so the run's first program differed from the one `trainer plan` compiled for it, and the
    persistent cache served neither with the other."""

    @functools.wraps(fn)  # the program keeps fn's name (jit_update in profiles and the compile cache)
    def typed(params: Any, frozen: Any, inputs: Any) -> Any:
        return fn(params, frozen, jax.lax.with_sharding_constraint(inputs, rows))

    return typed


def forward_program(graphdef: nnx.GraphDef, fn: Callable[..., Any], shardings: ModelShardings, mesh: Mesh, *,
                    packs: bool, shares: bool) -> Any:
    """A ForwardPass's jitted program `(params, frozen, inputs) -> [B, T] outputs`: `fn` over the
    micro-batches stacked on axis 0 of `inputs`, one at a time (see ForwardPass)."""

    def one(model, xs):
        if packs:
            return fn(model, *xs[:-1], packed=xs[-1])
        return fn(model, *xs[:-1], shared=xs[-1]) if shares else fn(model, *xs)

    def program(params, frozen, inputs):  # inputs: [M, mb, ...] each (and the packed rows)
        model = nnx.merge(graphdef, params, frozen)
        out = jax.lax.map(lambda xs: one(model, xs), inputs)
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)

    rows = mesh_lib.rows(mesh, axis=1)
    return jax.jit(
        mesh_lib.with_activation_layout(mesh, typed_inputs(program, rows)),
        in_shardings=(shardings.params, shardings.frozen, rows),
        out_shardings=mesh_lib.rows(mesh),
    )


def make_update(graphdef: nnx.GraphDef, tx: optax.GradientTransformation, loss_fn: LossFn,
                param_shardings: Any) -> Callable[[TrainState, Any, Any], tuple[TrainState, dict[str, Any]]]:
    """The pure update `(state, frozen, batch) -> (state, stats)` of a model with `graphdef`."""

    def update(state: TrainState, frozen: Any, batch: Any) -> tuple[TrainState, dict[str, Any]]:
        grads, agg = summed_grads(graphdef, loss_fn, state.params, frozen, batch)
        grads = jax.lax.with_sharding_constraint(grads, param_shardings)  # reduce-scattered, never whole
        empty = agg.denom <= 0  # no token in the loss: nothing to learn from
        denom = jnp.where(empty, 1.0, agg.denom)
        grads = jax.tree.map(lambda g: g / denom, grads)
        loss = agg.total / denom
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        def apply(state: TrainState) -> TrainState:
            updates, new_opt_state = tx.update(grads, state.opt_state, state.params)
            return TrainState(optax.apply_updates(state.params, updates), new_opt_state)

        # A branch, not a select between old and new: the donated buffers update in place.
        # An empty mini-batch leaves parameters, optimizer state and schedule untouched
        # (AdamW would still move them through momentum and weight decay).
        new_state = jax.lax.cond(finite & ~empty, apply, lambda state: state, state)
        stats = {
            "loss": loss,
            "grad_norm": grad_norm,
            "finite": finite,
            "empty": empty,
            "means": dict(agg.means),
            "maxima": dict(agg.maxima),
            "minima": dict(agg.minima),
        }
        return new_state, stats

    return update


def summed_grads(graphdef: nnx.GraphDef, loss_fn: LossFn, params: Any, frozen: Any,
                 batch: Any) -> tuple[Any, LossOutput]:
    """Float32 gradients (of the trained parameters only) of the summed loss and the summed
    LossOutput over the micro-batches stacked on axis 0 of every leaf of `batch`."""

    def micro_loss(p, example):
        out = loss_fn(nnx.merge(graphdef, p, frozen), example)
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
