"""Ctrl-C (SIGINT) and SIGTERM during a run: stop with a checkpoint, or at once.

While the learner trains, the first signal asks it to stop after the current
step; it then saves a checkpoint and the run ends with a one-line message. A
second signal, or any signal outside training (loading, evaluation), ends the
process at once: one line, no traceback, exit status 128 + the signal. Nothing
is damaged by that: checkpoints are renamed into place only when complete and
every other file is replaced atomically.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(Exception):
    """Training stopped on a signal after saving a checkpoint; `exit_code` is 128 + the signal."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class StopOnSignal:
    """A context manager that installs the handlers and restores the previous ones on exit."""

    def __init__(self, log: Callable[[str], None]) -> None:
        self.log = log
        self.received: signal.Signals | None = None
        self._learner: Any = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopOnSignal:
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)

    def stop_gracefully(self, learner: Any) -> None:
        """From now on the first signal asks `learner` to stop after its step."""
        self._learner = learner

    def stop_at_once(self) -> None:
        self._learner = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self._learner is not None and self.received is None:
            self.received = sig
            self.log(
                f"{sig.name}: stopping after the current step with a checkpoint "
                f"(send {sig.name} again to exit at once)"
            )
            self._learner.request_stop()
            return
        sys.stdout.flush()
        print(f"trainer: {sig.name}: exiting now; the last finished checkpoint is kept", file=sys.stderr, flush=True)
        os._exit(128 + signum)
