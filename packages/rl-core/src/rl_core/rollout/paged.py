"""The `paged` rollout backend: paged KV cache, continuous batching, own weights.

How a rollout runs (the host loop, `rollout.scheduler.HostLoop`, around one jitted call, `rollout.step.engine_step`):
- Each prompt's prefix (all but its last token) is prefilled once, in chunks of
  C tokens interleaved with decoding, into pages the prompt holds.
- Each of its G samples then takes a decode slot: it shares the prefix's full
  pages (reference-counted), gets its own copy of the partly filled last page,
  and starts by running the prompt's last token, whose logits give its first
  completion token. Pages are added as it grows and freed when it ends.
- The S slots decode k tokens per call; between calls the host retires
  finished samples and refills their slots with waiting ones. A sample ends at
  an end-of-sequence token, at its prompt's own limit (`Requests.max_new_tokens`)
  or, checked on the host between calls on the text of its new tokens, soon
  after one of its prompt's `Requests.stop_strings` (at most k - 1 tokens past
  it, and one token past it so that a caller can keep an EOS that follows):
  its tokens up to there are the ones it would have had without those limits.
- On a mesh the engine is R = data x fsdp independent replicas, each with its
  own page pool, its S slots and its share of the prompts (one call advances
  them all: every array has a leading replica axis split over those devices),
  so each device decodes only its own requests.
- A pool that runs dry frees waiting prompts' prefixes, then the youngest running
  samples (their pages freed, the sample requeued), never the oldest, which
  always completes: a preempted sample restarts later and, as every token draws
  with its completion's own key, produces exactly the same tokens. A pool that
  cannot hold one completion is a ValueError before the first call.
- A row with a session handle (`Requests.sessions`) keeps its sequence's pages
  when it ends, and a later prompt naming the handle prefills only what follows
  the part of the held sequence it shares (its prefill starts at that position):
  an episode's next turn continues from its cached prefix. Idle held sequences
  are the first pages a dry pool takes back (the prompt is then prefilled whole:
  the same tokens); `release(handles)` frees them, new weights and any exception
  free them all (rl_core.rollout.retained).
- A model with a recurrent state (the adapter's optional `state_spec`: Qwen3.5's linear-attention
  layers) also gets a pool of state rows per replica beside the page pool (`EngineSettings.state_rows`):
  one row per prompt prefix, running sample and retained sequence, taken and given back with their
  pages (rl_core.rollout.replica); each prefill chunk then holds one prompt's tokens. A model
  mixing windowed and global layers (Gemma 3) keeps its windowed layers' keys and values in those
  rows too, a ring of W slots per sequence (rl_models.paged_window), and its global layers in pages;
  its chunks may add prompts that start at position 0 after the first (the adapter's optional
  `fresh_states_share_chunks`), so short prompts share a device call as without rings.
- A model whose every layer is windowed (the adapter's optional `kv_window`: Mistral v0.1) gives
  back, as each sample decodes, the pages wholly behind the window of its next query (a sample
  with a session keeps its whole sequence).
Weights: `update_weights` makes the engine's copy once per step in one jitted
program (the adapter's `inference_copy`: compute dtype, adapters merged), laid
out for decoding (split over `tensor`, whole on every data/fsdp device), so
decoding never gathers a weight; with unrolled layers (the adapter's `loop_stacks`),
one array per layer, so no call copies a weight (see `rl_core.rollout.unstacked`).
Partial rollouts (`partial_rollouts`, rl_core.rollout.feed): between device calls the host loop
(a rollout's or the server's) reads the engine's `feed`; weights published there with a newer
version decode the following calls ("continue": the running samples keep the keys and values
older weights wrote; "recompute": `rl_core.rollout.replica.Replica.recompute` has them, and
every held prompt prefix, prefilled again under the new weights first). Each token records the
version that sampled it (`Completions.token_version`).
The engine reaches the model only through the adapter it is built with (`paging`, an
`rl_core.policy.protocols.PagedModel`: the pool's shape, the paged forward, the inference copy).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from rl_core.runtime import mesh as mesh_lib
from rl_core.runtime import multihost
from rl_core.policy.protocols import PagedModel
from rl_core.policy.traits import ChunkSharingStates, LoopStackedPaging, ShardedStates, StatefulPaging, WindowedPaging
from rl_core.rollout import attention as attention_lib
from rl_core.rollout import scheduler
from rl_core.rollout.backend import Capabilities, EngineCounters, Requests
from rl_core.rollout.feed import WeightFeed
from rl_core.rollout.pages import PagePool, PoolExhausted
from rl_core.rollout.paged_settings import EngineSettings
from rl_core.rollout.ragged import tpu_kind_for_lowering
from rl_core.rollout.retained import Retained
from rl_core.rollout.step import Prefill, Slots, engine_step
from rl_core.rollout.unstacked import restack, unstack, unstack_shardings
from rl_core.rollout.sampler import Completions, SamplingParams

DECODE_RULES = {**mesh_lib.RULES, "embed": None, "batch": None, "experts": None}
"""Inference weights: split over `tensor` only, whole on every data/fsdp/expert device (each
device's replica decodes alone, so a mixture's experts are all there too)."""

REPLICAS = mesh_lib.BATCH
"""The mesh axes the engine's replicas are laid over (the leading axis of its pools, slots and chunks)."""


PAGING_METHODS = ("cache_spec", "forward", "inference_copy")


def check_paging(paging: Any) -> None:
    """A TypeError naming what `paging` lacks unless it is an `rl_core.policy.protocols.PagedModel`."""
    if not isinstance(paging, PagedModel):
        missing = [n for n in PAGING_METHODS if not callable(getattr(paging, n, None))]
        raise TypeError(
            f"the paged engine needs paging=, an adapter implementing rl_core.policy.protocols.PagedModel "
            f"(rl_models.PAGED_TRANSFORMER for rl_models' transformers); {type(paging).__name__} "
            f"lacks {', '.join(missing)}"
        )


class PagedBackend:
    """`RolloutBackend` with a paged KV cache and continuous batching (see the module docstring).

    `paging` runs the model (see `rl_core.policy.protocols.PagedModel`; rl_models.PAGED_TRANSFORMER for its
    transformers). `compiles` counts traced device programs (steps and weight refreshes).
    `replicas` (R) is the number of data/fsdp devices of the mesh (1 without one).
    `partial_rollouts` ("off", "continue", "recompute"): what a rollout does with weights
    published to `feed` while it runs (see the module docstring); off: it has no feed.
    """


    def __init__(self, graphdef: nnx.GraphDef, settings: EngineSettings, *, paging: PagedModel,
                 eos_ids: Sequence[int], pad_id: int, mesh: Mesh | None = None, param_shardings: Any = None,
                 partial_rollouts: str = "off", platform: str | None = None) -> None:
        if not eos_ids:
            raise ValueError("eos_ids is empty: generation could never stop early")
        if partial_rollouts not in ("off", "continue", "recompute"):
            raise ValueError(f"partial_rollouts = {partial_rollouts!r}: must be one of off, continue, recompute")
        check_paging(paging)
        self.graphdef = graphdef
        self.paging = paging
        self.settings = settings
        self.eos_ids = tuple(int(e) for e in eos_ids)
        self.pad_id = int(pad_id)
        self.mesh = mesh
        self.param_shardings = param_shardings
        # the platform its programs are for (default JAX's backend; tests lower TPU programs on a CPU host)
        self.kv = attention_lib.choose(settings.attention, settings.page_size, platform)
        self.version = -1
        self.compiles = 0
        self.weights: Any = None
        self._infer_graphdef: nnx.GraphDef | None = None
        self._stacks: tuple[str, ...] = ()  # the weights' entries kept as one array per layer
        self._cache_spec: tuple[int, int, int, Any] | None = None
        self._state_spec: Any = None  # one sequence's recurrent state (`paging.state_spec`), None without one
        self._state_axes: Any = None  # its leaves' logical axes (`paging.state_axes`; None: whole on each replica)
        self.kv_window: int | None = None  # every layer's window (`paging.kv_window`): pages behind it are freed
        self.fresh_share_chunks = False  # prompts starting fresh may join a state model's chunk (the adapter's)
        self.state_pools: list[PagePool] | None = None  # each replica's state rows (a model with a state)
        self.states: Any = ()
        self._refresh: Any = None
        self._steps: dict[SamplingParams, Any] = {}
        self.replicas = mesh_lib.batch_devices(mesh) if mesh is not None else 1
        self.pools = [PagePool(settings.pool_pages) for _ in range(self.replicas)]
        self.pages: Any = None
        self.retained = Retained()
        self._counters = EngineCounters()  # what the host loops tallied (`count`)
        self.partial_rollouts = partial_rollouts
        self.feed: WeightFeed | None = None if partial_rollouts == "off" else WeightFeed()
        # it stops each sample at its own limits and stop strings with one program for any number of
        # rows; it retains sequences by handle; with a feed, published weights reach a running rollout
        self.capabilities = Capabilities(row_limits=True, retains=True, takes_published=self.feed is not None,
                                         counts_prefill=True, routing=True)
        self.switches = 0  # weight versions taken from the feed mid-rollout

    # -- weights ---------------------------------------------------------------------------

    def decode_shardings(self, abstract_state: Any) -> Any:
        """NamedShardings of the inference weights (None without a mesh)."""
        if self.mesh is None:
            return None

        def one(var: nnx.Variable) -> NamedSharding:
            names = var.get_metadata("out_sharding", None) or (None,) * len(var.shape)
            return NamedSharding(self.mesh, mesh_lib.logical_spec(names, var.shape, self.mesh, DECODE_RULES))

        shardings = jax.tree.map(one, abstract_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
        return nnx.to_pure_dict(shardings)

    def _build_refresh(self, params: Any) -> None:
        def copy(p):
            return nnx.split(self.paging.inference_copy(nnx.merge(self.graphdef, p)))

        graphdef, abstract = jax.eval_shape(copy, params)
        self._infer_graphdef = graphdef
        model = nnx.merge(graphdef, abstract)  # shapes only: what the adapter reads the config from
        self._cache_spec = self.paging.cache_spec(model)
        paging = self.paging  # its optional abilities: rl_core.policy.traits
        self.kv_window = paging.kv_window(model) if isinstance(paging, WindowedPaging) else None
        max_tokens = self.settings.pages_per_sequence * self.settings.page_size  # no sequence holds more
        self._state_spec = paging.state_spec(model, max_tokens) if isinstance(paging, StatefulPaging) else None
        stateful = self._state_spec is not None
        self._state_axes = paging.state_axes(model) if stateful and isinstance(paging, ShardedStates) else None
        # a prefill chunk may add prompts that start fresh (the adapter's; default: one sequence a chunk)
        self.fresh_share_chunks = (stateful and isinstance(paging, ChunkSharingStates)
                                   and bool(paging.fresh_states_share_chunks(model)))
        if self._state_spec is not None:
            if self.settings.state_pool_rows < 3:
                raise ValueError(f"state_rows = {self.settings.state_rows}: a state pool needs at least 3 rows "
                                 f"(a scratch row, a prompt's and its sample's)")
            self.state_pools = [PagePool(self.settings.state_pool_rows) for _ in range(self.replicas)]
        self._stacks = tuple(paging.loop_stacks(model)) if isinstance(paging, LoopStackedPaging) else ()
        out = self.decode_shardings(abstract)
        if out is not None:
            out = unstack_shardings(out, nnx.to_pure_dict(abstract), self._stacks)
        self.weight_shardings = out

        def refresh(p):
            self.compiles += 1
            return unstack(nnx.to_pure_dict(copy(p)[1]), self._stacks)

        kwargs = {} if self.mesh is None else {"in_shardings": (self.param_shardings,), "out_shardings": out}
        self._refresh = jax.jit(refresh, **kwargs)

    def update_weights(self, params: Any, version: int) -> None:
        """The engine's copy of `params` (one program: cast, merge adapters, reshard)."""
        if self._refresh is None:
            self._build_refresh(params)
        self._take(params, version)
        self.release()  # held keys and values are the old weights'

    def _take(self, params: Any, version: int) -> None:
        """Decode with `params` from the next call on (the pages keep what they hold)."""
        self.weights = self._refresh(params)
        self.version = version
        if self.feed is not None:
            self.feed.forget_through(version)

    def publish(self, params: Any, version: int) -> bool:
        """Offer `params` (version `version`) to the running rollout through the feed (False without one)."""
        if self.feed is None:
            return False
        self.feed.publish(version, params)
        return True

    # -- counters ----------------------------------------------------------------------------

    def counters(self) -> EngineCounters:
        return self._counters

    def count(self, tally: EngineCounters) -> None:
        """Add what one host loop (rl_core.rollout.scheduler.HostLoop) tallied."""
        self._counters = self._counters + tally

    @property
    def prefill_tokens(self) -> int:
        return self._counters.prefill_tokens

    @property
    def reused_tokens(self) -> int:
        return self._counters.reused_tokens

    @property
    def preemptions(self) -> int:
        return self._counters.preemptions

    @property
    def evictions(self) -> int:
        return self._counters.evictions

    @property
    def peak_pages(self) -> int:
        return self._counters.peak_pages

    # -- retained sequences ------------------------------------------------------------------

    def new_sessions(self, n: int) -> np.ndarray:
        """`n` session handles this engine never gave out (for `Requests.sessions`)."""
        return self.retained.new_handles(n)

    def release(self, handles: Sequence[int] | np.ndarray | None = None) -> None:
        """Free the sequences held under `handles` (those it no longer holds are skipped); None: all."""
        if handles is None:
            self.retained.forget()
            for pool in self.pools + (self.state_pools or []):
                pool.reset()  # between rollouts only retained sequences hold pages (and state rows)
            return
        for handle in np.asarray(handles, np.int64).reshape(-1).tolist():
            where = self.retained.replica_of(handle)
            if where is not None:
                self.retained.drop(handle, self.pools[where], self.rows_of(where))

    def rows_of(self, replica: int) -> PagePool | None:
        """`replica`'s state rows (None for a model without a recurrent state)."""
        return None if self.state_pools is None else self.state_pools[replica]

    def follow_feed(self) -> bool:
        """Between device calls: take the feed's weights when they are newer than the engine's
        (True when it did; the following calls decode with them)."""
        newer = None if self.feed is None else self.feed.newer_than(self.version)
        if newer is None:
            return False
        version, params = newer
        self._take(params, version)  # mid-rollout: the running sequences' pages stay (recompute: the scheduler's)
        self.switches += 1
        return True

    def weight_bytes(self) -> int:
        return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(self.weights))

    # -- the device program ----------------------------------------------------------------

    def step_program(self, sampling: SamplingParams) -> Any:
        if sampling not in self._steps:
            s = self.settings

            def step(weights, pages, prefill, copy_src, copy_dst, slots, key):
                self.compiles += 1

                def model():  # called where the model runs, so each layer's slice folds to its array
                    return nnx.merge(self._infer_graphdef, restack(weights, self._stacks))
                # decided over every replica, so the chunk's forward stays a real branch under vmap
                run_prefill = jnp.any(prefill.page_rows > 0)

                def one(pages, prefill, copy_src, copy_dst, slots):
                    return engine_step(model, pages, prefill, copy_src, copy_dst, slots, key, self.kv,
                                       paging=self.paging, steps=s.steps_per_sync, sampling=sampling,
                                       eos_ids=self.eos_ids, pad_id=self.pad_id, run_prefill=run_prefill,
                                       top_logprobs=s.top_logprobs)

                if self.replicas == 1:  # the same program without a batch axis of one
                    out = one(*jax.tree.map(lambda x: x[0], (pages, prefill, copy_src, copy_dst, slots)))
                    return jax.tree.map(lambda x: x[None], out)
                return jax.vmap(one)(pages, prefill, copy_src, copy_dst, slots)

            kwargs: dict[str, Any] = {"donate_argnums": (1,)}
            if self.mesh is not None:
                rows = NamedSharding(self.mesh, P(REPLICAS))
                pool = (self.pool_sharding(), self.state_sharding())
                kwargs.update(in_shardings=(self.weight_shardings, pool, rows, rows, rows, rows,
                                            mesh_lib.replicated(self.mesh)),
                              out_shardings=(pool, rows, rows, rows, (rows, rows), rows))
            self._steps[sampling] = jax.jit(step, **kwargs)
        return self._steps[sampling]

    def pool_sharding(self) -> Any:
        """The pools [R, ...] split over the replicas, and over `tensor` on their kv heads."""
        pools = jax.eval_shape(self._init_pages)
        spec = mesh_lib.logical_spec(self.kv.pool_axes(len(pools)), pools[0].shape[1:], self.mesh, DECODE_RULES)
        return NamedSharding(self.mesh, P(REPLICAS, *spec))

    def state_sharding(self) -> Any:
        """The state pools [R, layers, Q, ...] split over the replicas, and over `tensor` where the
        adapter names an axis of a state leaf that it splits (a ring's kv heads: `paging.state_axes`)."""
        shapes = jax.eval_shape(self._init_states)
        if self._state_axes is None:
            return tuple(NamedSharding(self.mesh, P(REPLICAS)) for _ in shapes)

        def one(shape, axes):  # axes name a leaf's [layers, ...]; its row axis (Q) stays whole
            names = (axes[0], None, *axes[1:])
            return NamedSharding(self.mesh, P(REPLICAS, *mesh_lib.logical_spec(names, shape.shape[1:], self.mesh,
                                                                                 DECODE_RULES)))

        return tuple(one(shape, axes) for shape, axes in zip(shapes, self._state_axes, strict=True))

    def call(self, step: Any, prefill: Prefill, copy_src: np.ndarray, copy_dst: np.ndarray, slots: Slots,
             key: jax.Array) -> tuple[np.ndarray, np.ndarray, Slots, tuple[np.ndarray, np.ndarray], np.ndarray | None]:
        """One device call on every replica's inputs (leading axis R): (tokens [R, S, k],
        log-probs [R, S, k], slots after, top (ids, log-probs) [R, S, k, K], a mixture of experts'
        routing [R, S, k, layers, E_k] or None), on the host of every process."""
        inputs = (prefill, copy_src, copy_dst, slots)
        if self.mesh is not None:
            inputs = multihost.program_inputs(inputs, NamedSharding(self.mesh, P(REPLICAS)))
        (self.pages, self.states), tokens, logp, after, top, routing = step(
            self.weights, (self.pages, self.states), *inputs, key)
        return multihost.to_host((tokens, logp, after, top, routing))

    def _spec(self) -> tuple[int, int, int, Any]:
        assert self._cache_spec is not None, "update_weights sets it"
        return self._cache_spec

    def _init_pages(self) -> Any:
        layers, kv_heads, head_dim, dtype = self._spec()
        pools = self.kv.init(layers, kv_heads, head_dim, dtype, self.settings.pool_pages)
        return tuple(jnp.broadcast_to(x, (self.replicas, *x.shape)) for x in pools)

    def _init_states(self) -> Any:
        """Each replica's state pool: per leaf of `state_spec` [R, layers, Q, ...] zeros (() without one)."""
        if self._state_spec is None:
            return ()
        q = self.settings.state_pool_rows
        return tuple(jnp.zeros((self.replicas, x.shape[0], q, *x.shape[1:]), x.dtype) for x in self._state_spec)

    def lower_step(self, sampling: SamplingParams, key: jax.Array, platforms: tuple[str, ...] | None = None) -> Any:
        """The device step lowered for these weights (`.compile().as_text()` gives its HLO), for
        `platforms` (default this host's)."""
        s = self.settings
        m, c, n, r = s.pages_per_sequence, s.prefill_chunk, s.slots, self.replicas
        zeros = lambda *shape: np.zeros((r, *shape), np.int32)  # noqa: E731
        prefill = Prefill(zeros(c), zeros(c), zeros(c, m), zeros(c))
        slots = Slots(zeros(n), zeros(n), zeros(n), zeros(n), np.zeros((r, n), bool), zeros(n, m), zeros(n, 2),
                      zeros(n), zeros(n))
        pages = (jax.eval_shape(self._init_pages), jax.eval_shape(self._init_states))
        # a TPU kernel's lowering asks the chip's kind, which jit reads from the mesh it traced under
        with tpu_kind_for_lowering() if platforms and "tpu" in platforms else contextlib.nullcontext():
            traced = self.step_program(sampling).trace(self.weights, pages, prefill, zeros(n), zeros(n), slots, key)
            return traced.lower(lowering_platforms=platforms) if platforms else traced.lower()

    # -- the host loop -----------------------------------------------------------------------

    def reset_after_failure(self) -> None:
        """After a host loop failed: nothing retained, every page free, and a pool that a failed call
        took (donated) and left deleted dropped, so the next rollout starts a fresh one (no page's
        content outlives a rollout)."""
        self.retained.forget()
        for pool in self.pools + (self.state_pools or []):
            pool.reset()
        if self.pages is not None and any(x.is_deleted() for x in jax.tree.leaves((self.pages, self.states))):
            self.pages = None

    def ensure_pages(self) -> None:
        """Allocate the KV pool on the device unless it holds one (a failed call may have deleted it)."""
        if self.pages is None:
            kwargs = {} if self.mesh is None else {"out_shardings": self.pool_sharding()}
            self.pages = jax.jit(self._init_pages, **kwargs)()
            rows = {} if self.mesh is None else {"out_shardings": self.state_sharding()}
            self.states = jax.jit(self._init_states, **rows)() if self._state_spec is not None else ()

    def generate(self, requests: Requests, sampling: SamplingParams, key: jax.Array) -> Completions:
        if self.weights is None:
            raise RuntimeError("PagedBackend.generate before update_weights: no weights to decode with")
        # the host loop (it frees every page on any exit); each row and token stamped with the version that sampled it
        return scheduler.rollout(self, requests, sampling, key)


__all__ = ["EngineSettings", "PagedBackend", "PoolExhausted"]
