"""What a learner's checkpoint holds, and how a learner takes it back.

Arrays (Orbax): the policy's trained parameters and optimizer state and the PRNG key
at the top (the layout of every earlier checkpoint), each other model's (PPO's
critic) under its name; never the frozen base. JSON: the step, the data stream's
position, the algorithm's own state (`extra_state`, e.g. DAPO's carried groups) and,
with async rollouts, the batch in flight (collected, not trained on yet) with the
version of the weights that sampled it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rl_core.async_rollout import InFlight

if TYPE_CHECKING:
    from rl_core.learner import RLLearner

POLICY = "policy"


def state_arrays(learner: RLLearner) -> dict[str, Any]:
    arrays = {"params": learner.params, "opt_state": learner.opt_state, "rng": learner.rng}  # never the frozen base
    arrays.update({name: model.state._asdict() for name, model in learner.models.items() if name != POLICY})
    return arrays


def state_meta(learner: RLLearner) -> dict[str, Any]:
    meta = {"step": learner.step, "data_position": learner.data.position, "extra": learner.extra_state()}
    if learner.in_flight is not None:  # sampled, not trained on yet: the resumed run trains on it
        flight = learner.in_flight
        meta["in_flight"] = {"version": flight.version, "batch": learner.batch_to_json(flight.batch)}
    return meta


def load_state(learner: RLLearner, arrays: dict[str, Any], meta: dict[str, Any]) -> None:
    """Put what `state_arrays` and `state_meta` saved back into `learner`."""
    learner.params, learner.opt_state, learner.rng = arrays["params"], arrays["opt_state"], arrays["rng"]
    for name, model in learner.models.items():
        if name != POLICY:
            model.params, model.opt_state = arrays[name]["params"], arrays[name]["opt_state"]
    learner.step = int(meta["step"])
    learner.data.position = int(meta["data_position"])
    learner.load_extra_state(meta.get("extra", {}))
    flight = meta.get("in_flight")
    learner.in_flight = None if flight is None else InFlight(learner.batch_from_json(flight["batch"]), int(flight["version"]))
