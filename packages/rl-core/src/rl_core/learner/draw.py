"""What one collection draws on and counts, passed down its steps as values (no thread holds
them): its own sampling keys (`KeyStream`, split from the supply's key) and its tally (seconds,
tokens generated, reward failures), together a `KeysAndTally`."""

from __future__ import annotations

import dataclasses

import jax


@jax.jit
def split_key(key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(next carried key, key to use): the values of `jax.random.split`, in one small program
    where the eager split and the unpacking of its result compile and dispatch two."""
    carried, used = jax.random.split(key)
    return carried, used


class KeyStream:
    """A collection's own sampling keys: each call splits the key it holds (the values of
    `jax.random.split`, as the state's stream splits). A collection passes it down its steps as a
    value and leaves its last key in the supply it returns: nothing on a thread holds it, and a
    collection on the rollout thread never touches the learner's state."""

    def __init__(self, key: jax.Array) -> None:
        self.key = key

    def __call__(self) -> jax.Array:
        self.key, used = split_key(self.key)
        return used


def collection_tally() -> dict[str, float]:
    """What a collection counts from zero: every sampled token counts, including groups a variant then drops."""
    return {"time/rollout": 0.0, "time/reward": 0.0, "perf/generated_tokens": 0.0, "perf/kept_tokens": 0.0,
            "rewards/failed": 0.0}


@dataclasses.dataclass
class KeysAndTally:
    """A collection's keys (`keys`; None: the learner state's training stream) and its tally."""

    keys: KeyStream | None = None
    tally: dict[str, float] = dataclasses.field(default_factory=lambda: {"time/rollout": 0.0, "time/reward": 0.0})
