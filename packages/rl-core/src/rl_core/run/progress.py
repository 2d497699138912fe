"""Progress of a loop of steps: a live bar with an ETA on a terminal, plain lines elsewhere.

Under nohup, SLURM or CI the output is a file, where a live bar shows nothing
until the end; there the same information is printed as one plain line every
`every_steps` steps or `every_seconds` seconds, whichever comes first, and at
the last step.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

SHOWN = (
    ("rewards/total/mean", "reward", ".3f"),
    ("eval/accuracy", "acc", ".3f"),
    ("perf/tokens_per_sec", "tok/s", ".0f"),
    ("loss", "loss", ".4f"),
)
"""(metric key, label, format) of the numbers shown beside the count."""


def clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class ProgressBar:
    """Step count, a few metrics, elapsed time and ETA (silent when disabled)."""

    def __init__(
        self,
        total: int,
        *,
        enabled: bool,
        description: str = "train",
        stream: TextIO | None = None,
        every_steps: int | None = None,
        every_seconds: float = 30.0,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.enabled = enabled
        self.total = total
        self.description = description
        self._stream = stream if stream is not None else sys.stdout
        self._plain = enabled and not Console(file=self._stream).is_terminal
        self._every_steps = every_steps or max(1, total // 10)
        self._every_seconds = every_seconds
        self._now = now
        self._start = now()
        self._first_step: int | None = None
        self._last_line = (None, self._start)  # (step, time) of the last plain line
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=Console(file=self._stream),
            disable=not enabled or self._plain,
        )
        self._task = self._progress.add_task(description, total=total, info="")

    def __enter__(self) -> ProgressBar:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        info = "  ".join(f"{label} {metrics[key]:{fmt}}" for key, label, fmt in SHOWN if key in metrics)
        if self._first_step is None:
            self._first_step = step  # a resumed run starts counting its speed here
            self._start = self._now()
            self._last_line = (step, self._start)
        self._progress.update(self._task, completed=step, info=info)
        if self._plain:
            self._plain_line(step, info)

    def eta_seconds(self, step: int) -> float | None:
        """Remaining seconds at the speed since the first update; None before any step was timed."""
        done = step - (self._first_step or 0)
        if done <= 0:
            return None
        return (self._now() - self._start) / done * (self.total - step)

    def _plain_line(self, step: int, info: str) -> None:
        last_step, last_time = self._last_line
        now = self._now()
        due = step >= self.total or step - last_step >= self._every_steps or now - last_time >= self._every_seconds
        if step == last_step or not due:
            return
        self._last_line = (step, now)
        eta = self.eta_seconds(step)
        parts = [
            f"{self.description}: step {step}/{self.total} ({step / max(self.total, 1):.0%})",
            info,
            f"elapsed {clock(now - self._start)}",
            f"eta {clock(eta)}" if eta is not None else "",
        ]
        print("  ".join(p for p in parts if p), file=self._stream, flush=True)
