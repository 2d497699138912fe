"""A table of sampled completions on the console: what the model writes and what each reward paid.

Every `training.console_samples_every_steps` steps (and at the first step a process logs) the
step's samples (the `training.samples_per_step` that samples.jsonl keeps) are printed as a
`rich` table: the prompt, the completion, each reward function's score, the weighted total,
the advantage and the length in tokens. Long texts are cut in the middle, keeping their start
and their end (where the answer usually is), and line breaks are shown as ⏎ so that a row
stays a row. Model text is shown as text, never read as rich markup.

`training.console_samples = "auto"` prints it only beside the progress bar on a terminal, where
it appears above the bar; `"always"` prints it in logs and with --no-progress as well.
`trainer show` and `trainer samples` print samples with the same table (`samples_table`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rl_core.run.sink_values import reward_functions

PROMPT_CHARS = 80
"""Longest prompt shown (its start and its end)."""
COMPLETION_CHARS = 240
"""Longest completion shown (its start and its end)."""
SAME_PROMPT = "〃"
"""Shown for a prompt equal to the row above's (a group's samples share one)."""


def cut(text: str, limit: int) -> str:
    """`text` on one line (⏎ for line breaks), at most `limit` characters: its start and end around `…`.

    cut("abcdefghij", 7) == "abcd…ij": two thirds of the room for the start, the rest for the end.
    """
    text = text.replace("\r\n", "\n").replace("\n", "⏎")
    if len(text) <= limit:
        return text
    head = (limit - 1) * 2 // 3
    tail = limit - 1 - head
    return text[:head] + "…" + (text[-tail:] if tail else "")


def _number(value: Any, fmt: str = ".3g") -> Text:
    if not isinstance(value, (int, float)):
        return Text("")
    style = "green" if value > 0 else "red" if value < 0 else "dim"
    return Text(f"{value:{fmt}}", style=style)


def samples_table(samples: Sequence[Mapping[str, Any]], *, title: str | None = None,
                  prompt_chars: int = PROMPT_CHARS, completion_chars: int = COMPLETION_CHARS) -> Table:
    """A rich Table of samples (records of samples.jsonl): a step column when they span several steps."""
    functions = reward_functions(samples)
    steps = {s.get("step") for s in samples}
    table = Table(title=title, show_lines=True, title_justify="left", expand=True)
    if len(steps) > 1:
        table.add_column("step", justify="right")
    table.add_column("prompt", overflow="fold", ratio=1, min_width=12)
    table.add_column("completion", overflow="fold", ratio=3, min_width=24)
    for name in functions:  # a long name folds onto two lines rather than taking the texts' room
        table.add_column(name, justify="right", overflow="fold", max_width=14)
    table.add_column("reward", justify="right")
    table.add_column("adv", justify="right")
    table.add_column("len", justify="right")
    previous = None
    for s in samples:
        prompt = s.get("prompt", "")
        shown = SAME_PROMPT if prompt == previous and len(steps) == 1 else cut(prompt, prompt_chars)
        previous = prompt
        row = [Text(str(s.get("step", "")))] if len(steps) > 1 else []
        row += [Text(shown), Text(cut(s.get("completion", ""), completion_chars))]
        row += [_number(s.get("rewards", {}).get(name)) for name in functions]
        row += [_number(s.get("reward")), _number(s.get("advantage"), "+.3f"), Text(str(s.get("length", "")))]
        table.add_row(*row)
    return table


class ConsoleSamples:
    """A sink (rl_core.run.sinks.MetricsSink) that prints a samples table every `every_steps` steps."""

    def __init__(self, *, every_steps: int, console: Console | None = None) -> None:
        self.every_steps = every_steps
        # without a file, rich writes to sys.stdout as it is at each print: under a live progress
        # bar that is the bar's redirection, so the table appears above the bar
        self.console = console or Console()
        self._first: int | None = None

    @staticmethod
    def wanted(mode: str, *, progress: bool, is_terminal: bool | None = None) -> bool:
        """Whether `training.console_samples = mode` prints tables in this process."""
        if is_terminal is None:
            is_terminal = Console(file=sys.stdout).is_terminal
        return mode == "always" or (mode == "auto" and progress and is_terminal)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Metrics are the progress bar's to show."""

    def write_samples(self, step: int, samples: Sequence[Mapping[str, Any]]) -> None:
        if self._first is None:
            self._first = step
        if step == self._first or step % self.every_steps == 0:
            self.console.print(samples_table(samples, title=f"step {step}: samples"))

    def close(self) -> None:
        """Nothing to close: the console is the process's."""
