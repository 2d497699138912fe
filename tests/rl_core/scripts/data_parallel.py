"""Two training steps on 1 device and on every device, in this process; prints the comparison.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=4 (set before jax is
imported) to get 4 simulated CPU devices. Prints one JSON line.
"""

import json

import jax
import numpy as np

from rl_core.learner.base import data_mesh
from rl_core.types import TrainExample
from toy_run import DATA_PARALLEL_TRAINING, make_learner, max_abs_diff, params_numpy


def run(devices):
    learner = make_learner(training=DATA_PARALLEL_TRAINING, mesh=data_mesh(devices))
    initial = params_numpy(learner)
    metrics = [learner.train_step() for _ in range(2)]
    # the layout the update sees: each micro-batch's rows split over the data axis
    b, t = learner.layout.batch_size, learner.rollout.max_new_tokens
    shapes = {"prompt_tokens": ((b, 8), np.int32), "prompt_mask": ((b, 8), np.float32),
              "completion_tokens": ((b, t), np.int32), "completion_mask": ((b, t), np.float32),
              "advantages": ((b,), np.float32)}
    zeros = TrainExample(**{name: np.zeros(shape, dtype) for name, (shape, dtype) in shapes.items()})
    mini = learner.layout.mini_batches(zeros)[0]
    # the update program places the host arrays itself: its input layout is the one it sees
    policy = learner.models["policy"]
    shardings = policy.update_step.lower(learner.state.models["policy"], policy.frozen, mini).compile().input_shardings[0][2]
    tokens = jax.device_put(mini.completion_tokens, shardings.completion_tokens)  # [micro-batches, rows, T]
    return learner, initial, metrics, {
        "devices": len(tokens.sharding.device_set),
        "shard_shapes": sorted({tuple(s.data.shape) for s in tokens.addressable_shards}),
        "params_replicated": all(x.sharding.is_fully_replicated for x in jax.tree.leaves(learner.params)),
    }


def main() -> None:
    devices = jax.devices()
    one, initial, one_metrics, one_layout = run(devices[:1])
    many, _, many_metrics, many_layout = run(devices)
    keys = [k for k in one_metrics[0] if k.startswith(("train/", "rewards/"))]
    print(
        json.dumps(
            {
                "device_count": len(devices),
                "params_max_abs_diff": max_abs_diff(params_numpy(one), params_numpy(many)),
                "params_moved": max_abs_diff(initial, params_numpy(one)),
                "metrics_max_abs_diff": max(
                    abs(a[k] - b[k]) for a, b in zip(one_metrics, many_metrics, strict=True) for k in keys
                ),
                "grad_norms": [m["train/grad_norm"] for m in one_metrics],
                "one_device": one_layout,
                "all_devices": many_layout,
            }
        )
    )


if __name__ == "__main__":
    main()
