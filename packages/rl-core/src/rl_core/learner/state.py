"""The learner's state, one value, and what a checkpoint holds of it.

`LearnerState` is everything a step changes: each trained model's TrainState by name, the
PRNG key, the step count, the prompt stream's position, the batch in flight (async rollouts),
the algorithm's carry (DAPO's carried groups), the non-finite guard's counts and the reward
audit's streaks. The learner holds one and replaces it;
nothing else writes it.

Arrays (Orbax): the policy's trained parameters and optimizer state and the PRNG key
at the top (the layout of every earlier checkpoint), each other model's (PPO's
critic) under its name; never the frozen base. JSON: the step, the data stream's
position, the guard's counts, the reward audit's streaks, the algorithm's carry (`extra`, e.g. DAPO's carried groups) and,
with async rollouts, the batches in flight (collected, not trained on yet, oldest first)
each with the version of the weights that sampled it: a list; a checkpoint written
before rollouts could run more than one step ahead holds one, as a dict.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from rl_core.rollout.async_rollout import InFlight
from rl_core.train.trainable import TrainState
from rl_core.train.update_stats import UpdateCounts

POLICY = "policy"


class LearnerState(NamedTuple):
    """What a learner's step changes (see the module docstring)."""

    models: Mapping[str, TrainState]
    """Each trained model's (params, opt_state) by name: "policy" always, PPO's "critic"."""
    rng: Any
    """The training key stream's PRNG key (replicated on the mesh)."""
    step: int = 0
    data_position: int = 0
    """The prompt stream's position: the next prompt a collection draws."""
    in_flight: tuple[InFlight, ...] = ()
    """With async rollouts, the batches collected ahead of the steps that train on them, oldest
    first (at most training.max_staleness)."""
    carry: Any = None
    """The algorithm's own state between steps (DAPO: the surplus groups), None by default."""
    updates: UpdateCounts = UpdateCounts()
    """The non-finite guard's counts (skipped, skipped in a row, empty updates)."""
    audit: Mapping[str, Any] | None = None
    """The reward audit's streaks after the last step (its `state_json`; rl_core.learner.reward_audit),
    None without an audit or before its first step."""

    @property
    def policy(self) -> TrainState:
        """The policy's (params, opt_state)."""
        return self.models[POLICY]

    def with_model(self, name: str, state: TrainState) -> LearnerState:
        return self._replace(models={**self.models, name: state})


def state_arrays(state: LearnerState) -> dict[str, Any]:
    policy = state.models[POLICY]
    arrays = {"params": policy.params, "opt_state": policy.opt_state, "rng": state.rng}  # never the frozen base
    arrays.update({name: model._asdict() for name, model in state.models.items() if name != POLICY})
    return arrays


def carry_to_json(carry: Any) -> dict[str, Any]:
    """The algorithm's carry as a checkpoint's `extra` holds it: {"carry": None} or the batch's JSON."""
    return {"carry": None if carry is None else carry.to_json()}


def carry_from_json(extra: Mapping[str, Any], batch: type | None) -> Any:
    """The carry `carry_to_json` wrote, a `batch` (None when there is none; an older checkpoint: {})."""
    data = extra.get("carry")
    return None if data is None or batch is None else batch.from_json(data)


def state_meta(state: LearnerState) -> dict[str, Any]:
    """The JSON half of a checkpoint; batches (in flight, the carry) by their own `to_json`."""
    meta = {"step": state.step, "data_position": state.data_position, "extra": carry_to_json(state.carry),
            "updates": state.updates._asdict()}
    if state.audit is not None:  # a resumed run audits as if it had not stopped
        meta["reward_audit"] = dict(state.audit)
    if state.in_flight:  # sampled, not trained on yet: the resumed run trains on them
        meta["in_flight"] = [{"version": f.version, "batch": f.batch.to_json()} for f in state.in_flight]
    return meta


def load_state(arrays: Mapping[str, Any], meta: Mapping[str, Any], *, models: Iterable[str],
               batch: type | None) -> LearnerState:
    """The state `state_arrays` and `state_meta` saved, for a learner training `models` whose
    collection's batches are of type `batch`."""
    trained = {name: TrainState(arrays["params"], arrays["opt_state"]) if name == POLICY
               else TrainState(arrays[name]["params"], arrays[name]["opt_state"]) for name in models}
    flight = meta.get("in_flight", [])
    flight = [flight] if isinstance(flight, Mapping) else flight  # an older checkpoint: one batch ahead
    return LearnerState(
        models=trained, rng=arrays["rng"], step=int(meta["step"]), data_position=int(meta["data_position"]),
        in_flight=tuple(InFlight(batch.from_json(f["batch"]), int(f["version"])) for f in flight),
        carry=carry_from_json(meta.get("extra", {}), batch),
        updates=UpdateCounts(**meta.get("updates", {})),  # a checkpoint written before they were kept: none
        audit=meta.get("reward_audit"),
    )
