"""A decoder-only transformer (Llama / Qwen / Mistral / Gemma 3 / SmolLM3 / OLMo 2 families) in Flax NNX.

Shapes: B batch, L query tokens, S key/value slots, D hidden, V vocab,
H query heads, K key/value heads, G = H // K queries per KV head, Dh head_dim.

Every piece of state is an `nnx.Param` carrying logical axis names
(`out_sharding` metadata: vocab, embed, heads, kv_heads, head_dim, mlp, norm, and
layers for the stacked layer axis) that a rules table maps to mesh axes. The
blocks are one `Block` whose parameters are stacked on a leading layer axis and
run under `lax.scan` (unrolled on CPU, see `scans_layers`), so a program's size
need not grow with depth. The KV cache
is a plain pair (k, v), each [layers, B, K, S, Dh] (head-major), that callers pass
in and get back, so a jitted sampler can thread it through `lax.while_loop`; the sampler's
(`init_decode_cache`) keeps only a ring of each windowed layer's window (rl_models.rings).
The model adds no implicit causal mask: the caller's `attention_mask` is the
whole truth. Kernels are stored [in, out] (Hugging Face stores [out, in]). `rl_models.lora`
can give projections low-rank adapters (`nnx.LoRAParam`) and store their kernels
quantized; `Linear` applies both. The block (attention, MLP) is `rl_models.block`'s, the
attention kernels `rl_models.attention`'s, the parameterised layers `rl_models.layers`', rotary
embeddings `rl_models.rope`'s. The paged rollout engine runs it through the adapter in
`rl_models.paged` (which builds on this module; nothing here knows the engine).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec

from rl_models import attention as attention_lib
from rl_models.block import (ROWS, Block, KVCache, KVCacheAxes, LaneKV, compute_dtype, lane_packed, norm, param_dtype,
                             stack_layers)
from rl_models.config import TransformerConfig
from rl_models.layers import Linear, param
from rl_models.moe import Routing
from rl_models.rings import RingKV, ring_size, scan_ring_layers
from rl_models.rope import layer_tables, rope_tables
from rl_models.sharding import constrain, shards

def scans_layers(config: TransformerConfig) -> bool:
    """Whether the blocks run as a loop (`config.scan_layers`; None: everywhere but on CPU).

    XLA:CPU runs a loop's iterations one after another, each body a separate set of
    kernels with the stacked residuals written and read back through dynamic slices;
    unrolled, it fuses across layers (tiny-qwen2 update, 1 core: 130 -> 77 ms). On
    accelerators the loop keeps compile time and program size flat in depth.
    """
    if config.scan_layers is not None:
        return config.scan_layers
    return attention_lib.target_platform() != "cpu"


def remat_policy(remat: str) -> Callable[..., bool] | None:
    """The `jax.checkpoint` policy of a `TransformerConfig.remat` setting (None: save nothing)."""
    policies = jax.checkpoint_policies
    return {
        "full": None,
        "dots_saveable": policies.dots_saveable,
        "dots_with_no_batch_dims_saveable": policies.dots_with_no_batch_dims_saveable,
        # Linear runs 2-D matmuls (no batch dims): the projections and MLP go to host memory
        "offload": policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
    }[remat]


FULL_WINDOW = 1 << 30
"""The window of a layer that sees every earlier slot (longer than any sequence)."""


def layer_windows(config: TransformerConfig) -> tuple[int, ...]:
    """Each layer's window in key slots (FULL_WINDOW: not windowed)."""
    return tuple(config.sliding_window if w else FULL_WINDOW for w in config.windowed())  # type: ignore[misc]


class LayerSettings:
    """What differs between layers: the rotary table each reads (rl_models.rope.layer_tables) and
    its window (`layer_windows`). `at(i)` gives layer i's (rope, window): with a static i, the
    table itself and the window as an int (None when not windowed); with a traced i (the layer
    scan), an index into the stacked tables and the windows, each only when the layers differ."""

    def __init__(self, config: TransformerConfig, ropes: dict[str, tuple[jax.Array, jax.Array]]):
        self.ropes = ropes
        self.tables = layer_tables(config)
        self.windows = layer_windows(config)
        kinds = list(ropes)
        # stacked once per forward pass (a scanned layer picks its own by index); unused: dead code to XLA
        self.stacked = tuple(jnp.stack([ropes[k][j] for k in kinds]) for j in (0, 1)) if len(kinds) > 1 else None
        self.index = jnp.asarray([kinds.index(t) for t in self.tables], jnp.int32)

    def at(self, i: int | jax.Array) -> tuple[tuple[jax.Array, jax.Array], int | jax.Array | None]:
        if isinstance(i, int):
            window = self.windows[i]
            return self.ropes[self.tables[i]], None if window == FULL_WINDOW else window
        if self.stacked is None:
            rope = next(iter(self.ropes.values()))
        else:
            rope = tuple(jax.lax.dynamic_index_in_dim(table, self.index[i], 0, False) for table in self.stacked)
        distinct = set(self.windows)
        if distinct == {FULL_WINDOW}:
            return rope, None
        if len(distinct) == 1:
            return rope, self.windows[0]
        return rope, jnp.asarray(self.windows, jnp.int32)[i]


EMBED_INIT = nnx.initializers.variance_scaling(1.0, "fan_in", "normal", out_axis=0)
"""How every model class draws its embedding tables (unit variance over the hidden axis)."""


def token_embedding(config: TransformerConfig, rngs: nnx.Rngs) -> nnx.Param:
    """The [vocab, hidden] token embedding every model class starts from, drawn by `EMBED_INIT`."""
    return param(EMBED_INIT(rngs.params(), (config.vocab_size, config.hidden_size), param_dtype(config)),
                 ("vocab", "embed"))


def check_call(tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array, slots: int | None,
               cache_index: jax.Array | int, outputs_from: int) -> None:
    """The shapes every model's `routed` takes: tokens [B, L], positions [B, L], attention_mask
    [B, L, S] (S: L without a cache, else the cache's `slots`), a static cache_index that leaves room
    for L tokens, and outputs_from inside the call. Raises ValueError naming what is off."""
    b, l = tokens.shape
    if not 0 <= outputs_from < l:
        raise ValueError(f"outputs_from={outputs_from}: the call has {l} positions")
    s = l if slots is None else slots
    if positions.shape != (b, l) or attention_mask.shape != (b, l, s):
        raise ValueError(
            f"tokens {tokens.shape} need positions of shape {(b, l)} (got "
            f"{positions.shape}) and attention_mask of shape {(b, l, s)} (got "
            f"{attention_mask.shape}); S is {'L' if slots is None else 'the cache length'}"
        )
    if isinstance(cache_index, int) and not 0 <= cache_index <= s - l:
        raise ValueError(f"cache_index={cache_index}: {l} tokens do not fit {s} cache slots")


def embed_tokens(model: Transformer, tokens: jax.Array) -> jax.Array:
    """Token embeddings [B, L, D] in the compute dtype (times sqrt(D) in the parameters' dtype
    with `embed_scale`, as Gemma's scaled embedding): the rows gathered first, then cast, so no
    compute-dtype copy of the whole table is made."""
    rows = jnp.take(model.embed[...], tokens, axis=0)
    if model.config.embed_scale:
        rows = rows * jnp.asarray(math.sqrt(model.config.hidden_size), rows.dtype)
    return rows.astype(compute_dtype(model.config))


def _vocab_rows(logits: jax.Array) -> jax.Array:
    """Logit chunks [B, C, V] split like the rows (and the vocab over tensor)."""
    return constrain(logits, ("act_batch", "act_length", "act_vocab")) if logits.ndim == 3 else logits


class Transformer(nnx.Module):
    """Decoder-only language model implementing `rl_core.policy.protocols.Policy`.

    `rngs` is used only to initialize parameters; nothing random is kept.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if config.hybrid:
            raise ValueError("a config with linear-attention layers is a rl_models.HybridTransformer "
                             "(rl_models.model_class(config) picks the class)")
        if config.layered:
            raise ValueError("a config whose layers differ in shape or share keys and values is a "
                             "rl_models.gemma4.Gemma4Transformer (rl_models.model_class(config) picks the class)")
        dtypes = {"dtype": compute_dtype(config), "param_dtype": param_dtype(config)}
        self.config = config
        self.embed = token_embedding(config, rngs)
        # Built one by one (the same random draws as unstacked blocks), then stacked.
        self.layers = stack_layers([Block(config, rngs=rngs) for _ in range(config.num_layers)])
        self.final_norm = norm(config)
        self.lm_head = None if config.tie_embeddings else Linear(
            config.hidden_size, config.vocab_size, axes=("embed", "vocab"), use_bias=False, **dtypes,
            rngs=rngs,
        )

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def init_cache(self, batch_size: int, max_len: int) -> KVCache:
        """Zeroed (k, v) in the compute dtype: each [layers, batch_size, K, max_len, Dh] when the
        layers are scanned (a `LaneKV` of [layers, batch_size, max_len, K * Dh] for heads narrower
        than 128 lanes: `lane_packed`), else a tuple of one [batch_size, K, max_len, Dh] per layer."""
        cfg = self.config
        shape = (batch_size, cfg.num_kv_heads, max_len, cfg.head_dim)
        dtype = compute_dtype(cfg)
        if scans_layers(cfg) and lane_packed(cfg):
            lanes = (cfg.num_layers, batch_size, max_len, cfg.num_kv_heads * cfg.head_dim)
            return LaneKV(jnp.zeros(lanes, dtype), jnp.zeros(lanes, dtype))
        if scans_layers(cfg):
            return jnp.zeros((cfg.num_layers, *shape), dtype), jnp.zeros((cfg.num_layers, *shape), dtype)
        return tuple(tuple(jnp.zeros(shape, dtype) for _ in range(cfg.num_layers)) for _ in "kv")

    def cache_axes(self) -> KVCacheAxes:
        """Logical axis names of (k, v), shaped like `init_cache`'s: split over rows and KV
        heads, never over slots."""
        if scans_layers(self.config) and lane_packed(self.config):  # split in whole 128-lane groups
            lanes = PartitionSpec("layers", "batch", "cache_slots", "kv_lanes")
            return LaneKV(lanes, lanes)
        if scans_layers(self.config):
            names = PartitionSpec("layers", "batch", "kv_heads", "cache_slots", "head_dim")
            return names, names
        per_layer = (PartitionSpec("batch", "kv_heads", "cache_slots", "head_dim"),) * self.config.num_layers
        return per_layer, per_layer

    def init_decode_cache(self, batch_size: int, max_len: int) -> KVCache | RingKV:
        """`init_cache` for a caller that writes each slot once, in order from slot 0 (a decode
        loop: the static sampler): each windowed layer keeps a ring of its window's slots, min(W,
        max_len), instead of max_len (rl_models.rings). Unrolled, one buffer per layer as
        `init_cache`'s; scanned, a `RingKV`. A model without windowed layers gets `init_cache`'s."""
        cfg = self.config
        windows = layer_windows(cfg)
        if set(windows) == {FULL_WINDOW}:
            return self.init_cache(batch_size, max_len)
        dtype = compute_dtype(cfg)

        def zeros(*lead: int, slots: int) -> jax.Array:
            return jnp.zeros((*lead, batch_size, cfg.num_kv_heads, slots, cfg.head_dim), dtype)

        sizes = [max_len if w == FULL_WINDOW else ring_size(w, max_len) for w in windows]
        if not scans_layers(cfg):
            return tuple(tuple(zeros(slots=n) for n in sizes) for _ in "kv")  # type: ignore[return-value]
        windowed = sum(w != FULL_WINDOW for w in windows)
        ring = ring_size(min(windows), max_len)
        full = None if windowed == cfg.num_layers else tuple(zeros(cfg.num_layers - windowed, slots=max_len)
                                                              for _ in "kv")
        return RingKV(full, (zeros(windowed, slots=ring), zeros(windowed, slots=ring)))  # type: ignore[arg-type]

    def decode_cache_axes(self) -> KVCacheAxes | RingKV:
        """Logical axis names of `init_decode_cache`'s cache (any length), split like `cache_axes`'."""
        if not scans_layers(self.config) or set(layer_windows(self.config)) == {FULL_WINDOW}:
            return self.cache_axes()
        names = PartitionSpec("layers", "batch", "kv_heads", "cache_slots", "head_dim")
        return RingKV(None if all(self.config.windowed()) else (names, names), (names, names))

    def __call__(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                 cache: KVCache | None = None, cache_index: jax.Array | int = 0, *,
                 outputs_from: int = 0, replay: jax.Array | None = None) -> tuple[jax.Array, KVCache | None]:
        """Hidden states [B, L - outputs_from, D] of positions `outputs_from`.. (after the
        final norm) and the updated cache. With the layers unrolled, the last block
        computes its query side (attention output and MLP) only for those positions:
        no later block reads the others. `replay`: see `routed`."""
        hidden, cache, _ = self.routed(tokens, positions, attention_mask, cache, cache_index, outputs_from=outputs_from,
                                       replay=replay)
        return hidden, cache

    def routed(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array,
               cache: KVCache | None = None, cache_index: jax.Array | int = 0, *, outputs_from: int = 0,
               replay: jax.Array | None = None) -> tuple[jax.Array, KVCache | None, Routing | None]:
        """`__call__`, and the routing of a mixture-of-experts model (rl_models.moe.Routing, each
        field [layers, B, L - outputs_from, ...]; None for a dense model). `replay` [layers, B, L, k]
        int32 (every position of the call) makes each layer use those experts instead of its
        router's choice (routing replay); a position whose entry is -1 routes freely (a prompt's
        positions, which the engines do not record); a dense model refuses it."""
        b, l = tokens.shape
        slots = None if cache is None else self._cache_slots(cache, attention_mask.shape[-1])
        check_call(tokens, positions, attention_mask, slots, cache_index, outputs_from)
        if replay is not None:
            want = (self.config.num_layers, b, l, self.config.experts_per_token)
            if not self.config.num_experts or replay.shape != want:
                raise ValueError(f"replay of shape {replay.shape}: the model needs {want} chosen experts"
                                 if self.config.num_experts else "replay: the model has no experts to replay")
        x = constrain(embed_tokens(self, tokens), ROWS)
        x, cache, routing = self._run_layers(x, rope_tables(self.config, positions), attention_mask, cache,
                                             cache_index, outputs_from, replay)
        return self.final_norm(x), cache, routing

    def _cache_slots(self, cache: KVCache | RingKV, mask_slots: int) -> int:
        """The slots S a call's mask must cover: its global layers' cache length, or with every
        layer windowed the mask's when each layer's cache is a ring of min(W, S) slots
        (`init_decode_cache`); ValueError for a cache of the wrong layers."""
        windows = layer_windows(self.config)
        if isinstance(cache, RingKV):
            rows = (0 if cache.full is None else cache.full[0].shape[0], cache.ring[0].shape[0])
            want = (windows.count(FULL_WINDOW), len(windows) - windows.count(FULL_WINDOW))
            if rows != want:
                raise ValueError(f"cache has {rows[0]} global and {rows[1]} windowed layers, the model {want[0]} "
                                 f"and {want[1]}")
            slots = [cache.ring[0].shape[3] if w != FULL_WINDOW else cache.full[0].shape[3]  # type: ignore[index]
                     for w in windows]
        elif isinstance(cache, LaneKV):
            slots = [cache.k.shape[2]] * cache.k.shape[0]
        elif isinstance(cache[0], tuple):
            slots = [c.shape[2] for c in cache[0]]
        else:
            slots = [cache[0].shape[3]] * cache[0].shape[0]
        if len(slots) != len(windows):
            raise ValueError(f"cache has {len(slots)} layers, the model {len(windows)}")
        full = [n for n, w in zip(slots, windows) if w == FULL_WINDOW]
        if full:
            s = max(full)
        else:
            s = mask_slots if all(n == ring_size(w, mask_slots) for n, w in zip(slots, windows)) else max(slots)
        for i, (n, w) in enumerate(zip(slots, windows)):
            if n != s and (w == FULL_WINDOW or n != ring_size(w, s)):
                raise ValueError(f"cache layer {i} holds {n} slots: a layer's cache holds the sequence's {s}, or "
                                 f"a windowed layer's its ring of min(window, {s}) = {ring_size(w, s)} "
                                 "(Transformer.init_decode_cache)")
        return s

    def _run_layers(self, x: jax.Array, ropes: dict[str, tuple[jax.Array, jax.Array]], mask: jax.Array,
                    cache: KVCache | None, cache_index: jax.Array | int, outputs_from: int,
                    replay: jax.Array | None = None) -> tuple[jax.Array, KVCache | None, Routing | None]:
        """Every block, as one `lax.scan` over the stacked layer parameters; the
        cache rides in the carry so each layer updates its slice in place. Each layer reads its
        rotary table and window (`LayerSettings`): static when the layer index is, else by index.
        Each layer's routing (experts only) is stacked on a leading layer axis, at the output
        positions; `replay` [layers, B, L, k] feeds each layer its own slice.

        Unrolled, the last block runs after the scan, its queries from `outputs_from` on.
        Scanned, every block keeps the same shape and the output is sliced: taking the last
        layer's slice out of the stacks would copy the other layers' (on TPU, whole FSDP shards).
        """
        graphdef, stacked = nnx.split(self.layers)
        n = self.config.num_layers
        scanned = scans_layers(self.config)
        settings = LayerSettings(self.config, ropes)
        if isinstance(cache, RingKV):  # scanned over the repeating group of layer kinds (rl_models.rings)
            windows = settings.windows

            def ring_layer(x, kv, i, windowed, row, replay_i):
                state = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, i, 0, False), stacked)
                window = min(windows) if windowed else None  # every windowed layer's is sliding_window
                return nnx.merge(graphdef, state)(x, settings.at(i)[0], mask, kv, cache_index, row, 0, window,
                                                  replay_i)

            x, cache, routing = scan_ring_layers(ring_layer, x, cache, tuple(w != FULL_WINDOW for w in windows),
                                                 replay)
            return x[:, outputs_from:], cache, jax.tree.map(lambda a: a[:, :, outputs_from:], routing)

        def make_layer(queries_from: int, static: int | None = None):
            def layer(x, cache, state, i, replay, slot=None):
                # i: the layer (its settings, unless static); slot: its row in `cache` (default i)
                rope, window = settings.at(i if static is None else static)
                if replay is not None:
                    replay = replay[:, queries_from:]
                return nnx.merge(graphdef, state)(x, rope, mask, cache, cache_index, i if slot is None else slot,
                                                  queries_from, window, replay)

            if self.config.remat != "none":  # keep what the policy saves; recompute the rest in the backward pass
                layer = jax.checkpoint(layer, prevent_cse=False, policy=remat_policy(self.config.remat))
            return layer

        layer = make_layer(0)
        own_slice = cache is not None and self.config.remat != "none"

        def body(carry, xs):
            if not own_slice:
                x, cache, routing = layer(*carry, *xs)
                return (x, cache), routing
            # a rematerialised layer saves its inputs for the backward pass: given the whole stacked
            # cache, every layer would save all of it (layers^2 cache slices; the shared-prompt scoring
            # pass of a 28-layer model, 27 GiB). It gets its own slice; the slice goes back outside.
            (x, cache), (state, i, replay) = carry, xs
            own = jax.tree.map(lambda c: jax.lax.dynamic_slice_in_dim(c, i, 1, axis=0), cache)
            x, own, routing = layer(x, own, state, i, replay, jnp.int32(0))
            cache = jax.tree.map(lambda c, o: jax.lax.dynamic_update_slice_in_dim(c, o, i, axis=0), cache, own)
            return (x, cache), routing

        def at_outputs(routing: Routing | None) -> Routing | None:  # [layers, B, L, ...] -> positions outputs_from..
            return jax.tree.map(lambda a: a[:, :, outputs_from:], routing)

        if cache is not None and isinstance(cache[0], tuple):  # one buffer per layer: unrolled
            ks, vs, routings = [], [], []
            for i in range(n):
                state = jax.tree.map(lambda a, i=i: a[i], stacked)
                kv = (cache[0][i][None], cache[1][i][None])  # a leading layer axis of 1: a bitcast
                queries_from = outputs_from if i == n - 1 else 0
                replay_i = None if replay is None else replay[i]
                x, kv, routing = make_layer(queries_from, static=i)(x, kv, state, jnp.int32(0), replay_i)
                ks.append(kv[0][0])
                vs.append(kv[1][0])
                routings.append(jax.tree.map(lambda a, q=queries_from: a[:, outputs_from - q:], routing))
            return x, (tuple(ks), tuple(vs)), jax.tree.map(lambda *a: jnp.stack(a), *routings)
        layers = jnp.arange(n, dtype=jnp.int32)
        if scanned or outputs_from == 0:
            # unrolled: the same body once per layer, each reading its own slice of the stacks
            (x, cache), routing = jax.lax.scan(body, (x, cache), (stacked, layers, replay),
                                               unroll=1 if scanned else n)
            return x[:, outputs_from:], cache, at_outputs(routing)
        head = jax.tree.map(lambda a: a[:-1], (stacked, layers, replay))
        (x, cache), routing = jax.lax.scan(body, (x, cache), head, unroll=max(n - 1, 1))
        last = jax.tree.map(lambda a: a[-1], (stacked, layers, replay))
        x, cache, last_routing = make_layer(outputs_from)(x, cache, *last)
        routing = jax.tree.map(lambda a, b: jnp.concatenate([a, b[None]]), at_outputs(routing), last_routing)
        return x, cache, routing

    def loop_view(self) -> Callable[[], Transformer]:
        """For a loop that runs the model at every iteration (a decode loop; see
        rl_core.policy.protocols.loop_policy): takes each layer's parameters out of the stacks
        once, here, outside the loop, and returns what the loop's body calls to get this model
        with its stacks rebuilt from those slices. With the layers unrolled (CPU), the body's
        slice of layer i out of a rebuilt stack folds to the slice itself (XLA simplifies a
        slice of a concatenation), so an iteration reads each layer's weights where they are
        instead of copying them out of the stacks at every token (SmolLM2-135M, 16 rows on CPU:
        98 of a decode step's 430 thread-ms; docs/results/2026-12-03-real-model-floors.md). Scanned
        (accelerators), the model itself: the scan reads its slices in place."""
        if scans_layers(self.config):
            return lambda: self
        n = self.config.num_layers
        model_def, model_state = nnx.split(self)
        layers_def, layers_state = nnx.split(self.layers)
        leaves, treedef = jax.tree.flatten(layers_state)
        # the barrier keeps XLA from folding the slices back into the stacks they came from
        pieces = jax.lax.optimization_barrier([[a[i] for i in range(n)] for a in leaves])

        def rebuild() -> Transformer:
            model = nnx.merge(model_def, model_state)
            model.layers = nnx.merge(layers_def, treedef.unflatten([jnp.stack(p) for p in pieces]))
            return model

        return rebuild

    def logits(self, hidden: jax.Array) -> jax.Array:
        """Float32 logits [..., V] from hidden states [..., D]."""
        return self.unembedding()(hidden)

    def unembedding(self) -> Callable[[jax.Array], jax.Array]:
        """`logits` with the weight made ready once (see `_unembedding`), soft-capped,
        cap * tanh(logits / cap), with `final_logit_softcapping`: every caller's logits are."""
        unembed, cap = self._unembedding(), self.config.final_logit_softcapping
        if cap is None:
            return unembed
        return lambda hidden: jnp.float32(cap) * jnp.tanh(unembed(hidden) / jnp.float32(cap))

    def _unembedding(self) -> Callable[[jax.Array], jax.Array]:
        """`logits` with the weight made ready once (cast to the compute dtype and, under a
        mesh, gathered over fsdp), for callers that unembed many chunks (rl_core.policy.logprobs):
        FSDP then gathers the [V, D] table once per pass, not once per chunk."""
        dtype = compute_dtype(self.config)
        head = self.lm_head
        if head is not None and (head.lora_a is not None or head.kernel_scale is not None):
            # adapted or quantized unembedding: the Linear's own path, per call
            return lambda hidden: _vocab_rows(head(hidden.astype(dtype)).astype(jnp.float32))
        if head is None:  # tied: the embedding table [V, D]
            w, names, spec = self.embed[...].astype(dtype), ("act_vocab", "act_embed"), "vd"
        else:
            w, names, spec = head.kernel[...].astype(dtype), ("act_embed", "act_vocab"), "dv"
        r = shards("act_batch")
        if r == 1:  # no mesh splits the rows
            return lambda hidden: jnp.einsum(f"...d,{spec}->...v", hidden.astype(dtype), w,
                                             preferred_element_type=jnp.float32)
        # one gathered copy per row shard, [R, ...] split over R (each device holds its own):
        # the backward pass sums each shard's weight gradient over every chunk locally and
        # reduces it once (the broadcast's transpose), where one shared copy would make XLA
        # all-reduce every chunk's partial gradient inside the chunk loop
        per_shard = constrain(jnp.broadcast_to(w, (r, *w.shape)), ("act_batch", *names))

        def unembed(hidden: jax.Array) -> jax.Array:
            h = hidden.astype(dtype)
            if h.ndim != 3 or h.shape[0] % r:
                return jnp.einsum(f"...d,{spec}->...v", h, w, preferred_element_type=jnp.float32)
            b, c, d = h.shape
            h = constrain(h.reshape(r, b // r, c, d), ("act_batch", None, None, None))
            out = jnp.einsum(f"rbcd,r{spec}->rbcv", h, per_shard, preferred_element_type=jnp.float32)
            return _vocab_rows(out.reshape(b, c, -1))

        return unembed
