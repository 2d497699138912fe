"""The paged engine's inference weights on 8 simulated CPU devices with fsdp=8.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before jax is
imported). Prints one JSON line: the collectives of the compiled decode step, of
the weight refresh and of the static sampler on the master weights; the dtype,
layout and size of the engine's weights; the pools' layout (one replica per
device); and whether greedy and sampled completions on the mesh equal those of
one device.
"""

import json

import jax
import numpy as np
from flax import nnx

from rl_core.runtime import hlo
from rl_core.runtime import mesh as mesh_lib
from rl_core.rollout.backend import Requests
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.sampler import GREEDY, Sampler, SamplingParams
from rl_core.policy.tokens import left_pad
from rl_models import PAGED_TRANSFORMER, CharTokenizer, Transformer, TransformerConfig

TOK = CharTokenizer()
SETTINGS = EngineSettings(max_prompt_tokens=16, max_new_tokens=6, page_size=4, slots=8, prefill_chunk=8,
                          steps_per_sync=2)


def measure(devices) -> dict:
    """The engine on an fsdp mesh of `devices` (8) and alone on one device."""
    mesh = mesh_lib.make_mesh(data=1, fsdp=len(devices), tensor=1, devices=devices)
    # float32 master weights, bfloat16 compute: the engine keeps a bfloat16 copy
    config = TransformerConfig.tiny(TOK.vocab_size, dtype="bfloat16")
    graphdef, state = nnx.split(Transformer(config, rngs=nnx.Rngs(0)))
    shardings = nnx.to_pure_dict(mesh_lib.param_shardings(state, mesh))
    master = jax.device_put(nnx.to_pure_dict(state), shardings)
    engine = PagedBackend(graphdef, SETTINGS, paging=PAGED_TRANSFORMER, eos_ids=(TOK.eos_ids[0],), pad_id=TOK.pad_id,
                          mesh=mesh, param_shardings=shardings)
    engine.update_weights(master, 1)
    key = jax.random.key(0)
    step_text = engine.lower_step(SamplingParams(temperature=1.0), key).compile().as_text()
    refresh_text = engine._refresh.lower(master).compile().as_text()

    tokens, mask = left_pad([TOK.encode(t) for t in ("12+3=", "7*8=", "1", "99-4=")], pad_id=TOK.pad_id,
                            max_tokens=8)
    sampler = Sampler(graphdef, max_new_tokens=6, eos_ids=(TOK.eos_ids[0],), pad_id=TOK.pad_id, mesh=mesh,
                      param_shardings=shardings)
    static_text = sampler._jit(False, True).lower(master, tokens, mask, key, GREEDY, 2).compile().as_text()

    on_mesh = engine.generate(Requests(tokens, mask, 2), GREEDY, key)
    alone = PagedBackend(graphdef, SETTINGS, paging=PAGED_TRANSFORMER, eos_ids=(TOK.eos_ids[0],), pad_id=TOK.pad_id)
    alone.update_weights(nnx.to_pure_dict(state), 1)
    one_device = alone.generate(Requests(tokens, mask, 2), GREEDY, key)
    # sampled: each completion draws with its own key, whichever replica decodes it
    sampled = SamplingParams(temperature=1.0)
    sampled_mesh = engine.generate(Requests(tokens, mask, 3), sampled, key)
    sampled_alone = alone.generate(Requests(tokens, mask, 3), sampled, key)

    # a next turn continuing each sample's retained sequence, rows in another order than the replicas
    # hold them (a continued prompt goes to its sequence's replica), equals a full prefill on one device
    handles = engine.new_sessions(len(tokens) * 3)
    first = engine.generate(Requests(tokens, mask, 3, sessions=handles), sampled, key)
    order = np.arange(len(handles))[::-1]
    history = [tokens[r // 3][mask[r // 3] > 0].tolist() + first.tokens[r, : max(1, int(first.lengths[r]) - 1)].tolist()
               + TOK.encode("[") for r in order]
    history_tokens, history_mask = left_pad(history, pad_id=TOK.pad_id, max_tokens=16)
    reused = engine.reused_tokens
    continued = engine.generate(Requests(history_tokens, history_mask, 1, sessions=handles[order]), sampled, key)
    reused = engine.reused_tokens - reused
    engine.release(handles)
    continued_alone = alone.generate(Requests(history_tokens, history_mask, 1), sampled, key)
    # partial rollouts (recompute) on the 8 replicas: new weights published once the first call returns
    partial = PagedBackend(graphdef, SETTINGS, paging=PAGED_TRANSFORMER, eos_ids=(TOK.eos_ids[0],), pad_id=TOK.pad_id,
                           mesh=mesh, param_shardings=shardings, partial_rollouts="recompute")
    partial.update_weights(master, 1)
    new_master = jax.device_put(nnx.to_pure_dict(nnx.split(Transformer(config, rngs=nnx.Rngs(1)))[1]), shardings)
    call = partial.call

    def publishing(*args):
        out = call(*args)
        if partial.version == 1 and partial.feed.version is None:
            partial.feed.publish(2, new_master)
        return out

    partial.call = publishing
    switched = partial.generate(Requests(tokens, mask, 3), sampled, key)
    real = switched.mask > 0
    old = (switched.token_version == 1) & real
    weights = jax.tree.leaves(engine.weights)
    master_leaves = jax.tree.leaves(master)
    return {
        "device_count": len(devices),
        "step": hlo.count(step_text),
        "step_collective_elements": [c.elements for c in hlo.collectives(step_text)],
        "replicas": engine.replicas,
        "pool_shape": list(engine.pages[0].shape),
        "pool_shard_shape": list(engine.pages[0].sharding.shard_shape(engine.pages[0].shape)),
        "step_all_gathers": [", ".join(c.shapes) for c in hlo.collectives(step_text) if c.kind == "all-gather"],
        "refresh": hlo.count(refresh_text),
        "static_sampler": hlo.count(static_text),
        "static_sampler_gathered_elements": sum(c.elements for c in hlo.collectives(static_text)
                                                if c.kind == "all-gather"),
        "weight_dtypes": sorted({str(x.dtype) for x in weights}),
        "weights_replicated": all(x.sharding.is_fully_replicated for x in weights),
        "weight_bytes": sum(x.size * x.dtype.itemsize for x in weights),
        "master_bytes": sum(x.size * x.dtype.itemsize for x in master_leaves),
        "same_greedy_as_one_device": bool(np.array_equal(on_mesh.tokens, one_device.tokens)),
        "same_sampled_as_one_device": bool(np.array_equal(sampled_mesh.tokens, sampled_alone.tokens)),
        "sampled_logp_gap": float(np.abs(sampled_mesh.logp - sampled_alone.logp).max()),
        "pages_free_after": all(pool.in_use == 0 for pool in engine.pools),
        "continued_same_as_one_device": bool(np.array_equal(continued.tokens, continued_alone.tokens)),
        "continued_logp_gap": float(np.abs(continued.logp - continued_alone.logp).max()),
        "continued_reused_tokens": int(reused),
        "continued_prefix_tokens": int(history_mask.sum() - len(history)),
        "partial_switches": partial.switches,
        "partial_versions": sorted(set(switched.token_version[real].tolist())),
        "partial_versions_in_order": bool((np.diff(switched.token_version, axis=1) >= 0).all()),
        "partial_old_tokens": int(old.sum()),
        "partial_old_tokens_as_unswitched": bool(np.array_equal(switched.tokens[old], sampled_mesh.tokens[old])),
        "partial_pages_free_after": all(pool.in_use == 0 for pool in partial.pools),
    }


def main() -> None:
    print(json.dumps(measure(jax.devices())))


if __name__ == "__main__":
    main()
