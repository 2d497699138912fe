"""A benchmark file's evaluation: greedy accuracy, unbiased pass@k and maj@k, each with a 95% interval,
over all rows and per `data_source`.

maj@k (self-consistency): the answers extracted from k samples vote (`final_answer`; ties go to
the answer seen first) and the prompt counts as solved when a sample giving the winning answer is
correct. With n >= k samples it is averaged over the n // k disjoint runs of k samples.

Intervals: mean +- 1.96 standard errors over the prompts (per-prompt values, sample standard
deviation); for a proportion near 0 or 1 with few prompts this normal interval is rough.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from rewards.latex import last_boxed, normalize_answer
from rewards.numbers import first_number, last_number
from rl_core import GREEDY, Prompt, Sampler, SamplingParams

from trainer.evaluate.heldout import correctness, generate_texts, pass_at_k
from trainer.tasks import Task

__all__ = ["benchmark", "final_answer", "interval", "majority_at_k"]


def final_answer(text: str) -> str:
    """The answer a completion gives, for voting: its last \\boxed{}, else the number after its last
    '####', else its last number, else its stripped text; numbers as exact fractions ("1/2")."""
    boxed = last_boxed(text)
    if boxed is not None:
        return normalize_answer(boxed)
    mark = text.rfind("####")
    number = first_number(text[mark + 4:]) if mark >= 0 else last_number(text)
    return str(number) if number is not None else text.strip()


def majority_at_k(answers: Sequence[str], correct: Sequence[float], k: int) -> float:
    """maj@k of one prompt from its n samples' answers and correctness (n >= k)."""
    n = len(answers)
    if not 1 <= k <= n or len(correct) != n:
        raise ValueError(f"maj@k needs 1 <= k <= n samples and one correctness per answer, got n={n}, k={k}")
    runs = []
    for start in range(0, n - k + 1, k):
        votes: dict[str, int] = {}
        for answer in answers[start:start + k]:
            votes[answer] = votes.get(answer, 0) + 1
        winner = max(votes, key=lambda a: votes[a])  # dicts keep order: ties go to the first seen
        first = answers.index(winner, start)
        runs.append(float(correct[first] >= 1.0))
    return float(np.mean(runs))


def interval(values: Sequence[float]) -> dict[str, float]:
    """{mean, low, high, n}: the mean and its 95% normal interval over `values`."""
    x = np.asarray(values, np.float64)
    mean = float(x.mean())
    half = 1.96 * float(x.std(ddof=1)) / math.sqrt(len(x)) if len(x) > 1 else 0.0
    return {"mean": mean, "low": max(0.0, mean - half), "high": min(1.0, mean + half), "n": len(x)}


def _summary(per_prompt: Mapping[str, np.ndarray], rows: np.ndarray) -> dict[str, Any]:
    return {name: interval(values[rows]) for name, values in per_prompt.items()}


def benchmark(
    sampler: Sampler,
    params: Any,
    tokenizer: Any,
    task: Task,
    prompts: Sequence[Prompt],
    *,
    k: int,
    samples: int,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Greedy accuracy, pass@k and maj@k of `prompts` (scored by `task`'s correctness reward), with
    intervals, overall and per data_source."""
    if not 1 <= k <= samples:
        raise ValueError(f"k = {k} and samples = {samples}: need 1 <= k <= samples")
    key = jax.random.PRNGKey(seed)
    texts, _ = generate_texts(sampler, params, tokenizer, prompts, max_prompt_tokens=task.max_prompt_tokens,
                              sampling=GREEDY, key=key)
    greedy = correctness(task, prompts, texts)
    sampled, _ = generate_texts(sampler, params, tokenizer, prompts, max_prompt_tokens=task.max_prompt_tokens,
                                sampling=SamplingParams(temperature=temperature), key=jax.random.fold_in(key, 1),
                                num_samples=samples)
    repeated = [p for p in prompts for _ in range(samples)]
    right = correctness(task, repeated, sampled).reshape(len(prompts), samples)
    answers = [final_answer(t) for t in sampled]
    per_prompt = {
        "accuracy": greedy,
        f"pass@{k}": np.asarray([pass_at_k(samples, int(c), k) for c in right.sum(1)]),
        f"maj@{k}": np.asarray([majority_at_k(answers[i * samples:(i + 1) * samples], right[i], k)
                                for i in range(len(prompts))]),
    }
    everything = np.ones(len(prompts), bool)
    result: dict[str, Any] = {"rows": len(prompts), "k": k, "samples_per_prompt": samples,
                              "reward": task.correct, **_summary(per_prompt, everything)}
    sources = [p.fields.get("data_source") for p in prompts]
    if any(s is not None for s in sources):
        names = sorted({str(s) for s in sources})
        result["per_data_source"] = {
            name: {"rows": int(sum(str(s) == name for s in sources)),
                   **_summary(per_prompt, np.asarray([str(s) == name for s in sources]))}
            for name in names
        }
    return result
