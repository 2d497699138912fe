"""number_words: sums answered in words, which a judge checks against the digits (issue #47).

`7+5 in words=` wants `twelve`. The reference is the number (`12`); no regex on the
completion finds 12 in "twelve", a judge model that reads both does. The task trains on a
judge's reward (its `judge:` defaults: a tiny judge warm-started here on CPU on the task's
own judge examples, `judge_examples`), and keeps an exact checker of spelled numbers,
`spelled_answer`, at weight 0: it scores nothing in training, but is the held-out accuracy and
the metric `rewards/spelled_answer/mean` says how often the judge's verdicts were right.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rewards import RewardSpec
from rl_core import Prompt

from trainer.tasks.task import Task, check_heldout, split_heldout

ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()

JUDGE_TEMPLATE = "{completion}={reference}?"
"""The trained judge's prompt: `twelve=12?`, to which it replies yes or no."""


def number_word(n: int) -> str:
    """0..99 in English words: 'seven', 'twelve', 'forty-two'."""
    if not 0 <= n < 100:
        raise ValueError(f"number_word({n}): only 0..99 are spelled")
    if n < 20:
        return ONES[n]
    tens, ones = divmod(n, 10)
    return TENS[tens] + (f"-{ONES[ones]}" if ones else "")


WORDS = {number_word(n): n for n in range(100)}


def spelled_answer_reward(prompts: Sequence[str], completions: Sequence[str], *, answer: Sequence[object],
                          **_: object) -> list[float]:
    """1.0 where the completion (stripped, any case) spells the reference number exactly."""
    return [float(WORDS.get(c.strip().lower()[:20]) == int(str(a))) for c, a in zip(completions, answer, strict=True)]


spelled_answer_reward.__name__ = "spelled_answer"


JUDGE_STEPS = 600
"""The judge's warm start (judge.train_steps, which overrides it)."""


def number_words(*, max_number: int = 9, teacher_slip_rate: float = 0.5, heldout_size: int = 20, seed: int = 0) -> Task:
    """a+b in words, a and b in 0..max_number; the warm start's teacher is off by one with
    probability `teacher_slip_rate`."""
    if not 1 <= max_number <= 49:
        raise ValueError(f"max_number = {max_number!r}: must be in [1, 49] (sums are spelled up to 99)")
    if not 0.0 <= teacher_slip_rate <= 1.0:
        raise ValueError(f"teacher_slip_rate = {teacher_slip_rate!r}: must be in [0, 1]")
    pairs = [(a, b) for a in range(max_number + 1) for b in range(max_number + 1)]
    check_heldout(heldout_size, len(pairs))
    train, heldout = split_heldout(pairs, heldout_size, seed)
    top = 2 * max_number

    def prompt(a: int, b: int) -> Prompt:
        return Prompt(f"{a}+{b} in words=", {"answer": str(a + b)})

    def teacher(p: Prompt, rng: np.random.Generator) -> str:
        n = int(p.fields["answer"])
        if rng.random() < teacher_slip_rate:  # off by one, within the spelled range
            n = n + 1 if n == 0 or (n < top and rng.random() < 0.5) else n - 1
        return number_word(n)

    def judge_examples(rng: np.random.Generator, count: int) -> list[tuple[str, str, str, bool]]:
        """(prompt, completion, reference, correct): half right, half another sum of the range."""
        out = []
        for _ in range(count):
            a, b = (int(x) for x in rng.integers(0, max_number + 1, 2))
            n = a + b
            wrong = int(rng.integers(0, top)) if rng.random() < 0.5 else None
            said = n if wrong is None else (wrong if wrong < n else wrong + 1)  # never n
            out.append((f"{a}+{b} in words=", number_word(said), str(n), said == n))
        return out

    longest = max(len(number_word(n)) for n in range(top + 1))
    return Task(
        name="number_words",
        description=f"a+b (0..{max_number}) answered in words; a judge model checks them against the digits",
        train=tuple(prompt(a, b) for a, b in train),
        heldout=tuple(prompt(a, b) for a, b in heldout),
        rewards=(RewardSpec(spelled_answer_reward, weight=0.0),),
        correct="spelled_answer",
        teacher=teacher,
        max_prompt_tokens=len(f"{max_number}+{max_number} in words=") + 1,
        max_new_tokens=longest + 3,
        judge={"train_steps": JUDGE_STEPS, "template": JUDGE_TEMPLATE, "verdict": "yes_probability",
               # the longest completion (the policy's max_new_tokens), "=", the sum, "?" and the BOS
               "max_prompt_tokens": longest + 3 + len(f"={top}?") + 1, "max_new_tokens": 4},
        judge_examples=judge_examples,
    )
