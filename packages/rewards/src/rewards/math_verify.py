"""The `math_verify` reward kind: Hugging Face's `math-verify` checks the completion's final answer
against the reference (LaTeX or plain expressions, sets, intervals, equations, units), in worker
processes with a hard timeout.

`math-verify` bounds its own parsing and comparison with signals, which work only in a process's main
thread; a reward runs in the trainer's scoring threads. So each completion is checked in the main
thread of a worker process (a `spawn` pool: no fork of the multithreaded trainer), and a check that
has not returned after `timeout_s` seconds is ended by ending its worker: it scores 0 and is counted
(`rewards/<name>/timeouts`). The pool serves one call at a time (overlapping scorings take turns).

Install it with the extra: `uv pip install 'rewards[math-verify]'` (the workspace's dev group has it).
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import threading
from collections.abc import Sequence

from rewards.manager import Scores

__all__ = ["MathVerify", "math_verify"]


STARTUP_S = 300.0
"""How long new workers may take to start and import math-verify (before any check's clock runs)."""


def _load(ready: threading.Barrier) -> None:
    import math_verify  # noqa: F401 - in each worker once, before its first check

    ready.wait()  # the parent starts the clocks of the checks only once every worker has loaded


def _check(item: tuple[str, str]) -> tuple[float, bool]:
    """(1.0 if the completion's answer equals the reference's else 0.0, whether math-verify raised)."""
    from math_verify import parse, verify

    reference, completion = item
    try:
        gold = parse(reference if "\\boxed" in reference or "$" in reference else f"${reference}$")
        found = parse(completion)
        return (1.0 if gold and found and verify(gold, found) else 0.0), False
    except Exception:  # noqa: BLE001 - counted by the caller: one odd string must not fail the batch
        return 0.0, True


class MathVerify:
    """``fn(prompts, completions, *, answer, **_) -> Scores``: math-verify's verdict on each completion."""

    def __init__(self, *, timeout_s: float = 5.0, workers: int = 2, reward_name: str = "math_verify") -> None:
        if not (isinstance(timeout_s, (int, float)) and not isinstance(timeout_s, bool) and timeout_s > 0):
            raise ValueError(f"timeout_s = {timeout_s!r}: must be a number of seconds > 0")
        if not (isinstance(workers, int) and not isinstance(workers, bool) and workers >= 1):
            raise ValueError(f"workers = {workers!r}: must be an int >= 1")
        self.timeout_s, self.workers = float(timeout_s), workers
        self.__name__ = reward_name
        self._pool: multiprocessing.pool.Pool | None = None
        self._lock = threading.Lock()

    def _workers(self) -> multiprocessing.pool.Pool:
        if self._pool is None:
            context = multiprocessing.get_context("spawn")
            ready = context.Barrier(self.workers + 1)
            self._pool = context.Pool(self.workers, initializer=_load, initargs=(ready,))
            try:
                ready.wait(STARTUP_S)
            except threading.BrokenBarrierError:
                self._end()
                raise RuntimeError(f"math_verify: {self.workers} worker processes did not start within {STARTUP_S:g} s") from None
        return self._pool

    def close(self) -> None:
        """End the worker processes (a later call starts new ones)."""
        with self._lock:
            self._end()

    def _end(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None

    def __del__(self) -> None:
        if getattr(self, "_pool", None) is not None:
            self._pool.terminate()

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[object],
                 **_: object) -> Scores:
        items = [(str(reference), completion) for reference, completion in zip(answer, completions, strict=True)]
        scores = [0.0] * len(items)
        counts = {"timeouts": 0.0, "errors": 0.0}
        with self._lock:
            pending = list(range(len(items)))
            while pending:
                results = self._workers().imap(_check, [items[i] for i in pending], chunksize=1)
                done = 0
                try:
                    for i in pending:
                        scores[i], failed = results.next(timeout=self.timeout_s)
                        counts["errors"] += failed
                        done += 1
                    pending = []
                except multiprocessing.TimeoutError:  # the check in order has hung: end its worker
                    counts["timeouts"] += 1
                    self._end()
                    pending = pending[done + 1:]  # the rest again, on fresh workers
        return Scores(scores, {f"rewards/{self.__name__}/{key}": value for key, value in counts.items()})


def math_verify(*, timeout_s: float = 5.0, workers: int = 2, reward_name: str = "math_verify") -> MathVerify:
    """The math_verify reward (1.0 when math-verify finds the completion's answer equal to field
    ``answer``), checking in `workers` processes with `timeout_s` seconds per completion."""
    if importlib.util.find_spec("math_verify") is None:
        raise ValueError("the math_verify reward needs the math-verify package: uv pip install 'rewards[math-verify]' "
                         "(or pip install 'math-verify[antlr4_13_2]')")
    return MathVerify(timeout_s=timeout_s, workers=workers, reward_name=reward_name)
