"""The loss-invariance contract, model half: every configuration (tests/support/invariance_contract.py's
`configs`: each installed algorithm's own, and GRPO's with each policy loss and aggregation no
algorithm uses) trained one step by its own learner under each layout of `LAYOUTS`, against the
plain one-device layout.

Run with XLA_FLAGS=--xla_force_host_platform_device_count=8 (set before jax is imported), or
in-process by the multidevice tier. Prints one JSON line: per configuration and layout, each
trained model's max abs difference of loss, gradient and gradient norm from the reference's,
and the layout the learner used.
"""

import json
import sys

import jax

import invariance_contract as contract
from rl_core.runtime import mesh as mesh_lib


def measure(devices, only: str | None = None) -> dict:
    out = {"device_count": len(devices), "configs": {}}
    for label, (algorithm, config) in contract.configs().items():
        if only is not None and label != only:
            continue
        reference, _ = contract.one_update(algorithm, config, {}, mesh_lib.make_mesh(devices=devices[:1]))
        runs = {}
        for name, ((data, fsdp, tensor), training) in contract.LAYOUTS.items():
            mesh = mesh_lib.make_mesh(data, fsdp, tensor, devices=devices[:data * fsdp * tensor])
            got, layout = contract.one_update(algorithm, config, training, mesh)
            runs[name] = {"layout": layout, "diffs": contract.max_diffs(got, reference)}
        out["configs"][label] = runs
    return out


if __name__ == "__main__":
    print(json.dumps(measure(jax.devices(), *sys.argv[1:])))
