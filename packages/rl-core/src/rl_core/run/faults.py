"""Named points where a crash test makes this process die or get a signal, deterministically.

Set `RL_VARIANTS_FAULTS` to a comma-separated list of `action@point` or
`action@point:key` (e.g. `kill@checkpoint:2,term@step:3`); the first time the
code passes `fault_point(point, key)` with a matching key, the process sends
itself the action's signal: `kill` (SIGKILL, it dies on the spot, like a power
cut or the OOM killer), `term` (SIGTERM, as schedulers and `docker stop` send)
or `int` (SIGINT, Ctrl-C); or `enospc`, which raises the OSError a full disk gives
(`[Errno 28] No space left on device`) at a `write` point. Each entry fires once. Points: `warm_start:<step>`,
`step:<step>` (after the rollout, before the update), `logged:<step>` (metrics
and samples written, no checkpoint yet), `checkpoint:<step>` (inside the save,
before it is final), `rewrite:<file stem>` (a rewrite's temporary file written,
not yet renamed), `final_eval`, `write:<file>` and `write:<file>:<step>` (a run-folder file
about to be written: metrics.jsonl, samples.jsonl, tensorboard (its events file), checkpoints,
or a rewritten file such as summary.json).

Unset, as outside tests, a fault point costs one environment lookup.
"""

from __future__ import annotations

import errno
import os
import signal
import sys

ENV = "RL_VARIANTS_FAULTS"
ACTIONS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT, "enospc": None}

_parsed: dict[str, list[tuple[str, str, str | None]]] = {}  # spec -> entries not fired yet


def _entries(spec: str) -> list[tuple[str, str, str | None]]:
    if spec not in _parsed:
        entries = []
        for item in filter(None, (part.strip() for part in spec.split(","))):
            action, at, where = item.partition("@")
            point, colon, key = where.partition(":")
            if not at or action not in ACTIONS or not point:
                raise ValueError(f"{ENV}: bad entry {item!r}; expected ACTION@POINT[:KEY] with ACTION in {sorted(ACTIONS)}")
            entries.append((action, point, key if colon else None))
        _parsed[spec] = entries
    return _parsed[spec]


def fault_point(point: str, key: object = None) -> None:
    """Send the configured signal to this process (or raise a full disk's OSError) if a fault is
    set for `point` (and `key`)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    entries = _entries(spec)
    for i, (action, where, wanted) in enumerate(entries):
        if where == point and (wanted is None or wanted == str(key)):
            del entries[i]
            if action == "enospc":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), ACTIONS[action])
            return
