"""GRPO on a mesh whose devices interleave two processes, against one process.

`python interleaved_processes.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT`, each
process with 2 simulated CPU devices (XLA_FLAGS), or with NUM_PROCESSES=1 and 4
devices for the reference. The fsdp=4 mesh takes the devices in the order
process 0 device 0, process 1 device 0, process 0 device 1, process 1 device 1,
so no process's rows are one block of a batch (as JAX's own device order for a
TPU v5e 4x4 slice interleaves hosts). The learner and its settings are those of
mesh_parallel.py (SGD, beta > 0 and two iterations, so the reference and the
old-policy passes run too). Process 0 writes the parameters after 3 steps and
the metrics of each step to OUT (.npz), then the parameters of 3 steps with async
rollouts two steps ahead (training.max_staleness = 2: the first step collects two
batches; one collection beside each update; in line in a multi-process run) and
packed rows (training.packing: each process packs the same batch, places its own
devices' blocks), then
the sampled completions of the paged engine on the same mesh (4 replicas,
scattered over the processes).
"""

import sys

import jax
import numpy as np

coordinator, processes, process_id, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=processes, process_id=process_id)

from mesh_parallel import STEPS, make_learner  # noqa: E402

from flax import nnx  # noqa: E402
from mesh_parallel import TOK  # noqa: E402

from rl_core.runtime import mesh as mesh_lib  # noqa: E402
from rl_core.runtime import multihost  # noqa: E402
from rl_core.rollout.backend import Requests  # noqa: E402
from rl_core.rollout.paged import EngineSettings, PagedBackend  # noqa: E402
from rl_core.rollout.sampler import SamplingParams  # noqa: E402
from rl_core.policy.tokens import left_pad  # noqa: E402
from rl_models import PAGED_TRANSFORMER, Transformer, TransformerConfig  # noqa: E402


def interleaved(devices: list) -> list:
    """Device j of every process, for j = 0, 1, ...: consecutive mesh positions change process."""
    by_process: dict[int, list] = {}
    for d in sorted(devices, key=lambda d: (d.process_index, d.id)):
        by_process.setdefault(d.process_index, []).append(d)
    return [d for column in zip(*by_process.values(), strict=True) for d in column]


devices = interleaved(jax.devices()) if processes > 1 else jax.devices()
mesh = mesh_lib.make_mesh(data=1, fsdp=4, tensor=1, devices=devices)


def trained(learner) -> list[np.ndarray]:
    return [np.asarray(jax.experimental.multihost_utils.process_allgather(x, tiled=True)) if processes > 1
            else np.asarray(x) for x in jax.tree.leaves(learner.params)]


learner = make_learner(mesh)
metrics = [learner.train_step() for _ in range(STEPS)]
params = trained(learner)
async_learner = make_learner(mesh, async_rollout="one_step", packing=True, max_staleness=2)
async_staleness = [async_learner.train_step()["async/staleness"] for _ in range(STEPS)]
async_params = trained(async_learner)


def paged_completions() -> tuple[np.ndarray, np.ndarray]:
    """Sampled completions of 5 prompts x 3 by the paged engine, each replica on its own device."""
    graphdef, state = nnx.split(Transformer(TransformerConfig.tiny(TOK.vocab_size), rngs=nnx.Rngs(1)))
    shardings = nnx.to_pure_dict(mesh_lib.param_shardings(state, mesh))
    weights = jax.tree.map(multihost.to_global, nnx.to_pure_dict(state), shardings)
    settings = EngineSettings(max_prompt_tokens=8, max_new_tokens=6, page_size=4, slots=2, prefill_chunk=8,
                              steps_per_sync=2)
    engine = PagedBackend(graphdef, settings, paging=PAGED_TRANSFORMER, eos_ids=(TOK.eos_ids[0],), pad_id=TOK.pad_id,
                          mesh=mesh, param_shardings=shardings)
    engine.update_weights(weights, 0)
    tokens, mask = left_pad([TOK.encode(t) for t in ("12+3=", "7*8=", "1", "99-4=", "5+5=")], pad_id=TOK.pad_id,
                            max_tokens=8)
    out = engine.generate(Requests(tokens, mask, 3), SamplingParams(temperature=1.0), jax.random.key(4))
    assert all(pool.in_use == 0 for pool in engine.pools)
    return out.tokens, out.logp


paged_tokens, paged_logp = paged_completions()
if process_id == 0:
    keys = sorted(k for k in metrics[0] if k.startswith(("train/loss", "rewards/", "completions/")))
    np.savez(out, *params, metrics=np.array([[m[k] for k in keys] for m in metrics]),
             owners=np.array([d.process_index for d in devices]), paged_tokens=paged_tokens,
             paged_logp=paged_logp, async_staleness=np.array(async_staleness),
             **{f"async_{i}": x for i, x in enumerate(async_params)})
