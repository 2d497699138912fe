"""The generated tasks: arithmetic, countdown and multiply, each from a seed with a fixed held-out split."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from rewards import RewardSpec, countdown_reward, numeric_answer_reward
from rl_core import Prompt

from trainer.tasks.task import Task, check_heldout, split_heldout


def carryless_sum(a: int, b: int) -> int:
    """a + b computed digit by digit without carrying (the classic slip)."""
    out, scale = 0, 1
    while a or b:
        out += ((a % 10 + b % 10) % 10) * scale
        a, b, scale = a // 10, b // 10, scale * 10
    return out


def arithmetic(*, digits: int = 2, teacher_slip_rate: float = 0.6, heldout_size: int = 500, seed: int = 0) -> Task:
    """a+b= with a, b of up to `digits` digits; the answer is the exact sum.

    The warm start's teacher forgets to carry with probability
    `teacher_slip_rate`, so the base policy carries only some of the time:
    right on problems without carries, often wrong on the others. RL has to
    find out from the reward alone that carrying pays.
    """
    if not 0.0 <= teacher_slip_rate <= 1.0:
        raise ValueError(f"teacher_slip_rate = {teacher_slip_rate!r}: must be in [0, 1]")
    if not 1 <= digits <= 3:
        raise ValueError(f"digits = {digits!r}: must be in [1, 3] (a and b below 10**digits: 10**(2*digits) problems)")
    n = 10**digits
    pairs = [(a, b) for a in range(n) for b in range(n)]
    check_heldout(heldout_size, len(pairs))
    train, heldout = split_heldout(pairs, heldout_size, seed)

    def prompt(a: int, b: int) -> Prompt:
        return Prompt(f"{a}+{b}=", {"answer": str(a + b)})

    return Task(
        name="arithmetic",
        description=f"addition of two numbers below {n}; reward 1 for the exact sum",
        train=tuple(prompt(a, b) for a, b in train),
        heldout=tuple(prompt(a, b) for a, b in heldout),
        rewards=(RewardSpec(numeric_answer_reward()),),
        correct="numeric_answer",
        teacher=lambda p, rng: str(carryless_sum(*map(int, p.text[:-1].split("+"))))
        if rng.random() < teacher_slip_rate
        else p.fields["answer"],
        max_prompt_tokens=2 * digits + 3,
        max_new_tokens=digits + 3,
    )


def _countdown_solution(numbers: Sequence[int], target: int) -> str | None:
    """A left-to-right expression over all numbers that equals target, if any."""
    for perm in itertools.permutations(numbers):
        for ops in itertools.product("+-*", repeat=len(numbers) - 1):
            expr = str(perm[0])
            value = perm[0]
            for op, x in zip(ops, perm[1:], strict=True):
                value = value + x if op == "+" else value - x if op == "-" else value * x
                expr = f"({expr}{op}{x})" if op != "*" or len(expr) > 2 else f"{expr}{op}{x}"
            if value == target:
                return expr
    return None


def countdown(*, count: int = 3, max_number: int = 9, heldout_size: int = 500, seed: int = 0) -> Task:
    """Reach the target with all given numbers and + - *; reward 1 for a correct expression."""
    check_heldout(heldout_size, 4000)
    rng = np.random.default_rng(seed)
    seen: dict[tuple, str] = {}
    while len(seen) < 4000:
        numbers = tuple(int(x) for x in rng.integers(1, max_number + 1, count))
        ops = rng.choice(list("+-*"), count - 1)
        value = numbers[0]
        for op, x in zip(ops, numbers[1:], strict=True):
            value = value + x if op == "+" else value - x if op == "-" else value * x
        if value < 0 or (numbers, value) in seen:
            continue
        solution = _countdown_solution(numbers, value)
        if solution is not None:
            seen[(numbers, value)] = solution
    problems = sorted(seen.items())
    train, heldout = split_heldout(problems, heldout_size, seed)

    def prompt(item) -> Prompt:
        (numbers, target), solution = item
        text = " ".join(map(str, numbers)) + f" to {target}:"
        return Prompt(text, {"numbers": list(numbers), "target": target, "solution": solution})

    return Task(
        name="countdown",
        description=f"combine {count} numbers (1-{max_number}) with + - * to reach the target",
        train=tuple(prompt(p) for p in train),
        heldout=tuple(prompt(p) for p in heldout),
        rewards=(RewardSpec(countdown_reward(wrong_format_score=0.1)),),
        correct="countdown",
        teacher=lambda p, rng: p.fields["solution"],
        max_prompt_tokens=32,
        max_new_tokens=16,
    )


def multiply(*, digits: int = 3, tool_rate: float = 0.3, train_size: int = 20_000, heldout_size: int = 500,
             seed: int = 0) -> Task:
    """a*b= with a, b of exactly `digits` digits, and a calculator tool (multi-turn).

    The model may call `<calc>a*b</calc>`, read the environment's `[value]` and answer;
    the reward is 1 for the exact product in its last turn. The warm start's teacher
    calls the tool on a `tool_rate` share of the problems and answers directly on the
    others, which a tiny model cannot learn to do for 3-digit numbers: the base policy
    is right mostly when it happens to call the tool, and RL has to find out that
    calling it pays.
    """
    if not 0.0 <= tool_rate <= 1.0:
        raise ValueError(f"tool_rate = {tool_rate!r}: must be in [0, 1]")
    if not 1 <= digits <= 4:
        raise ValueError(f"digits = {digits!r}: must be in [1, 4]")
    low, high = 10 ** (digits - 1), 10**digits
    count = (high - low) ** 2
    if train_size < 1 or train_size + heldout_size > count:
        raise ValueError(f"train_size = {train_size!r}: must be >= 1, with heldout_size at most {count} problems")
    check_heldout(heldout_size, count)
    rng = np.random.default_rng(seed)
    chosen = rng.choice(count, size=train_size + heldout_size, replace=False)
    pairs = [(low + int(k) // (high - low), low + int(k) % (high - low)) for k in chosen]
    train, heldout = pairs[heldout_size:], pairs[:heldout_size]

    def prompt(a: int, b: int) -> Prompt:
        return Prompt(f"{a}*{b}=", {"answer": str(a * b)})

    def teacher(p: Prompt, rng: np.random.Generator) -> list[str]:
        answer = p.fields["answer"]
        return [f"<calc>{p.text[:-1]}</calc>", answer] if rng.random() < tool_rate else [answer]

    turn = 2 * digits + 15  # <calc>a*b</calc> and EOS
    return Task(
        name="multiply",
        description=f"multiplication of two {digits}-digit numbers with a calculator tool (<calc>a*b</calc>)",
        train=tuple(prompt(a, b) for a, b in train),
        heldout=tuple(prompt(a, b) for a, b in heldout),
        rewards=(RewardSpec(numeric_answer_reward()),),
        correct="numeric_answer",
        teacher=teacher,
        max_prompt_tokens=2 * digits + 3,
        max_new_tokens=2 * turn + 8,
        environment="calculator",
        max_turns=3,
        max_turn_tokens=turn,
    )
