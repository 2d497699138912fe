"""Easy GSM8K-format word problems, generated from a seed: rows for the `gsm8k` file task.

    uv run python -m trainer.tasks.word_problems OUT.jsonl [--count N] [--seed S] [--steps 1|2] [--max-number M]

Each row is ``{"question": ..., "answer": "<worked steps>\\n#### N"}``, the layout of
GSM8K's own rows (`trainer.tasks.files` checks that the reward reads the reference's
``#### N``). Problems are one or two steps of + - * on numbers up to `max_number`
(answers are never negative), phrased from a few templates with names and objects
drawn from short lists. The same seed writes the same file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

__all__ = ["easy_word_problems", "write_word_problems"]

NAMES = ("Tom", "Anna", "Sam", "Lily", "Ben", "Mia", "Jack", "Emma", "Leo", "Zoe")
THINGS = ("apples", "pencils", "stickers", "marbles", "cookies", "books", "cards", "shells")


def _one_step(rng: np.random.Generator, name: str, thing: str, top: int) -> tuple[str, list[str], int]:
    kind = rng.integers(3)
    a, b = (int(x) for x in rng.integers(2, top + 1, 2))
    if kind == 0:
        q = f"{name} has {a} {thing}. {name} gets {b} more {thing}. How many {thing} does {name} have now?"
        return q, [f"{name} has {a} + {b} = {a + b} {thing}."], a + b
    if kind == 1:
        a, b = max(a, b), min(a, b)
        q = f"{name} has {a} {thing}. {name} gives away {b} {thing}. How many {thing} does {name} have left?"
        return q, [f"{name} has {a} - {b} = {a - b} {thing} left."], a - b
    a, b = int(rng.integers(2, 7)), int(rng.integers(2, 7))
    q = f"{name} has {a} boxes. Each box holds {b} {thing}. How many {thing} does {name} have in all?"
    return q, [f"{name} has {a} * {b} = {a * b} {thing}."], a * b


def _two_step(rng: np.random.Generator, name: str, thing: str, top: int) -> tuple[str, list[str], int]:
    kind = rng.integers(3)
    a, b, c = (int(x) for x in rng.integers(2, top + 1, 3))
    if kind == 0:
        q = (f"{name} has {a} {thing}. {name} buys {b} more and then finds {c} more. "
             f"How many {thing} does {name} have now?")
        return q, [f"After buying, {name} has {a} + {b} = {a + b} {thing}.",
                   f"After finding more, {name} has {a + b} + {c} = {a + b + c} {thing}."], a + b + c
    if kind == 1:
        a = a + b  # so that a - b + c is never negative
        q = (f"{name} has {a} {thing}. {name} gives {b} to a friend and then gets {c} more. "
             f"How many {thing} does {name} have now?")
        return q, [f"After giving some away, {name} has {a} - {b} = {a - b} {thing}.",
                   f"Then {name} has {a - b} + {c} = {a - b + c} {thing}."], a - b + c
    a, b = int(rng.integers(2, 6)), int(rng.integers(2, 6))
    q = (f"{name} has {a} bags with {b} {thing} in each bag, and {c} more {thing} outside the bags. "
         f"How many {thing} does {name} have in all?")
    return q, [f"The bags hold {a} * {b} = {a * b} {thing}.",
               f"In all {name} has {a * b} + {c} = {a * b + c} {thing}."], a * b + c


def easy_word_problems(count: int, *, seed: int = 0, steps: int = 2, max_number: int = 20) -> list[dict[str, str]]:
    """`count` distinct rows {question, answer}; `steps` 1 = one-step only, 2 = half one-step, half two-step."""
    if count < 1:
        raise ValueError(f"count = {count!r}: must be >= 1")
    if steps not in (1, 2):
        raise ValueError(f"steps = {steps!r}: must be 1 or 2")
    if not 5 <= max_number <= 1000:
        raise ValueError(f"max_number = {max_number!r}: must be in [5, 1000]")
    rng = np.random.default_rng(seed)
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    attempts = 0
    while len(rows) < count:
        attempts += 1
        if attempts > 50 * count + 1000:
            raise ValueError(f"count = {count!r}: too many for max_number = {max_number!r} (only {len(rows)} distinct)")
        name, thing = str(rng.choice(NAMES)), str(rng.choice(THINGS))
        make = _two_step if steps == 2 and rng.random() < 0.5 else _one_step
        question, work, answer = make(rng, name, thing, max_number)
        if question in seen:
            continue
        seen.add(question)
        rows.append({"question": question, "answer": "\n".join(work) + f"\n#### {answer}"})
    return rows


def write_word_problems(path: str | Path, count: int, **options) -> Path:
    """Write `easy_word_problems(count, **options)` as JSONL to `path`."""
    path = Path(path)
    rows = easy_word_problems(count, **options)
    path.parent.mkdir(parents=True, exist_ok=True)  # `data/easy.jsonl` in a fresh clone
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write easy GSM8K-format word problems as JSONL.")
    parser.add_argument("out")
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=2, choices=(1, 2))
    parser.add_argument("--max-number", type=int, default=20)
    args = parser.parse_args(argv)
    path = write_word_problems(args.out, args.count, seed=args.seed, steps=args.steps, max_number=args.max_number)
    print(f"wrote {args.count} problems to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
