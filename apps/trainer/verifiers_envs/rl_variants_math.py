"""A single-turn arithmetic taskset written in the `verifiers` package's style (verifiers.v1).

It runs in the verifiers venv (scripts/verifiers-env.sh), never in the workspace: `vf-eval
rl_variants_math` finds it on PYTHONPATH (trainer.verifiers puts this folder there). Each task is
one row of a JSON file (`--env.taskset.rows`: [{"prompt": ..., "answer": ...}], one trainer
episode's row); the agent answers in one chat turn, and the rubric is two weighted rewards:
`correct` (1.0: the last number of the reply is the answer) and `number` (0.2: the reply holds a
number at all, a signal a small model climbs before it is ever right).
"""

import json
import re
from pathlib import Path

import verifiers.v1 as vf

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class MathData(vf.TaskData):
    """One row: the question (`prompt`) and its reference answer."""

    answer: str = ""


class MathTask(vf.Task[MathData]):
    """The rubric: the reply's last number against the answer, and whether it gave a number."""

    @vf.reward(weight=1.0)
    async def correct(self, trace: vf.Trace) -> float:
        numbers = NUMBER.findall(trace.last_reply or "")
        return float(bool(numbers) and numbers[-1] == self.data.answer.strip())

    @vf.reward(weight=0.2)
    async def number(self, trace: vf.Trace) -> float:
        return float(bool(NUMBER.search(trace.last_reply or "")))


class MathConfig(vf.TasksetConfig):
    rows: str = ""
    """A JSON file of rows, each {"prompt": ..., "answer": ...}."""


class MathTaskset(vf.Taskset[MathTask, MathConfig]):
    def load(self) -> list[MathTask]:
        rows = json.loads(Path(self.config.rows).read_text()) if self.config.rows else [
            {"prompt": "What is 6 * 7? Answer with the number.", "answer": "42"}]
        return [MathTask(MathData(prompt=row["prompt"], answer=str(row.get("answer", ""))), self.config.task)
                for row in rows]


__all__ = ["MathTaskset"]
