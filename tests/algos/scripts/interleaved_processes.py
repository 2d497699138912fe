"""GRPO on a mesh whose devices interleave two processes, against one process.

`python interleaved_processes.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT`, each
process with 2 simulated CPU devices (XLA_FLAGS), or with NUM_PROCESSES=1 and 4
devices for the reference. The fsdp=4 mesh takes the devices in the order
process 0 device 0, process 1 device 0, process 0 device 1, process 1 device 1,
so no process's rows are one block of a batch (as JAX's own device order for a
TPU v5e 4x4 slice interleaves hosts). The learner and its settings are those of
mesh_parallel.py (SGD, beta > 0 and two iterations, so the reference and the
old-policy passes run too). Process 0 writes the parameters after 3 steps and
the metrics of each step to OUT (.npz).
"""

import sys

import jax
import numpy as np

coordinator, processes, process_id, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if processes > 1:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes=processes, process_id=process_id)

from mesh_parallel import STEPS, make_learner  # noqa: E402

from rl_core import mesh as mesh_lib  # noqa: E402


def interleaved(devices: list) -> list:
    """Device j of every process, for j = 0, 1, ...: consecutive mesh positions change process."""
    by_process: dict[int, list] = {}
    for d in sorted(devices, key=lambda d: (d.process_index, d.id)):
        by_process.setdefault(d.process_index, []).append(d)
    return [d for column in zip(*by_process.values(), strict=True) for d in column]


devices = interleaved(jax.devices()) if processes > 1 else jax.devices()
mesh = mesh_lib.make_mesh(data=1, fsdp=4, tensor=1, devices=devices)
learner = make_learner(mesh)
metrics = [learner.train_step() for _ in range(STEPS)]
params = [np.asarray(jax.experimental.multihost_utils.process_allgather(x, tiled=True)) if processes > 1
          else np.asarray(x) for x in jax.tree.leaves(learner.params)]
if process_id == 0:
    keys = sorted(k for k in metrics[0] if k.startswith(("train/loss", "rewards/", "completions/")))
    np.savez(out, *params, metrics=np.array([[m[k] for k in keys] for m in metrics]),
             owners=np.array([d.process_index for d in devices]))
