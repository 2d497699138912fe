"""Held-out evaluation: greedy accuracy, unbiased pass@k, lengths of right and wrong answers."""

from __future__ import annotations

from collections.abc import Sequence
from math import comb
from typing import Any

import jax
import numpy as np
from rewards import RewardManager
from rl_core.runtime import multihost
from rl_core import (
    decode_completions, encode_prompts, environment_factory, GREEDY, Prompt, RolloutConfig, Sampler, SamplingParams,
    Tokenizer,
)
from rl_core.episodes import agent_runtime, episode_metrics, EpisodeLimits, EpisodeRecord, run_episodes

from trainer.tasks import Task


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k) for c correct of n samples."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def call_rows(prompts: int, most: int) -> int:
    """Prompt rows a call of `prompts` real ones decodes: the next power of two, at most `most`.
    Padding to a few sizes keeps the compiled programs few (log2(most) + 2 at most) while no call
    decodes even twice its real rows (`eval.heldout_size=4` decodes 4, not a whole batch)."""
    if not 1 <= prompts <= most:
        raise ValueError(f"call_rows: prompts = {prompts} must be in [1, {most}]")
    return min(most, 1 << (prompts - 1).bit_length())


def _batches(prompts: Sequence[Prompt], batch_size: int, num_samples: int):
    """(prompts, real completions) per call: at most about `batch_size` completions each (one
    prompt at least), the prompts padded with repeats to `call_rows` of them."""
    per_call = max(1, batch_size // num_samples)
    for start in range(0, len(prompts), per_call):
        chunk = list(prompts[start : start + per_call])
        real = len(chunk) * num_samples
        yield chunk + [chunk[-1]] * (call_rows(len(chunk), per_call) - len(chunk)), real


def generate_texts(
    sampler: Sampler,
    params: Any,  # the policy's parameters, as nnx.merge takes them
    tokenizer: Tokenizer,
    prompts: Sequence[Prompt],
    *,
    max_prompt_tokens: int,
    sampling: SamplingParams,
    key: jax.Array,
    batch_size: int = 256,
    num_samples: int = 1,
) -> tuple[list[str], np.ndarray]:
    """`num_samples` completions (text) per prompt, prompt-major, and their lengths in tokens.

    Runs in batches of at most about `batch_size` completions, padded to a power-of-two number
    of prompts (`call_rows`), each prompt prefilled once for all of its samples.
    """
    texts: list[str] = []
    lengths: list[int] = []
    for chunk, real in _batches(prompts, batch_size, num_samples):
        tokens, mask = encode_prompts(tokenizer, [p.text for p in chunk], max_tokens=max_prompt_tokens)
        key, sub = jax.random.split(key)
        # gathered to every process: each scores all texts, the result is the same everywhere
        out = multihost.to_host(sampler(params, tokens, mask, sub, sampling, num_samples))
        texts += decode_completions(tokenizer, out.tokens[:real], out.mask[:real])
        lengths += out.lengths[:real].tolist()
    return texts, np.asarray(lengths)


def generate_episodes(
    sampler: Sampler,
    params: Any,
    tokenizer: Tokenizer,
    prompts: Sequence[Prompt],
    rollout: RolloutConfig,
    *,
    sampling: SamplingParams,
    key: jax.Array,
    batch_size: int = 256,
    num_samples: int = 1,
) -> tuple[list[str], np.ndarray, list[EpisodeRecord]]:
    """`generate_texts` for a multi-turn task: whole episodes with `rollout.environment`.

    Returns each episode's last model turn (what the task's reward scores), its model
    tokens and its record. Batches as in `generate_texts`."""
    texts: list[str] = []
    lengths: list[int] = []
    records: list[EpisodeRecord] = []
    make_env = environment_factory(rollout.environment, rollout.environment_options)
    limits = EpisodeLimits.from_rollout(rollout)
    for chunk, real in _batches(prompts, batch_size, num_samples):
        key, sub = jax.random.split(key)
        keys = iter(jax.random.split(sub, rollout.max_turns))

        def generate(tokens, mask, n):
            return sampler(params, tokens, mask, next(keys), sampling, n)

        out = run_episodes(generate, tokenizer, chunk, make_env, num_samples=num_samples, limits=limits)
        texts += out.texts[:real]
        lengths += out.completions.lengths[:real].tolist()
        records += out.episodes[:real]
    return texts, np.asarray(lengths), records


def generate_agent_episodes(
    sampler: Sampler,
    params: Any,
    tokenizer: Tokenizer,
    prompts: Sequence[Prompt],
    rollout: RolloutConfig,
    *,
    sampling: SamplingParams,
    key: jax.Array,
    batch_size: int = 256,
    num_samples: int = 1,
) -> tuple[list[str], np.ndarray, list[EpisodeRecord]]:
    """`generate_episodes` for `rollout.agent`: each prompt's agent, run against the policy served
    as in training (rl_core.episodes.agents), its requests answered by `sampler` with `sampling`.
    Returns each episode's result text (what the task's reward scores), model tokens and record."""
    texts: list[str] = []
    lengths: list[int] = []
    records: list[EpisodeRecord] = []
    run = agent_runtime()
    for chunk, real in _batches(prompts, batch_size, num_samples):
        key, sub = jax.random.split(key)
        calls = iter(range(1 << 30))

        def generate(tokens, mask, num_samples=1, **limits):  # limits: the runtime cuts each reply to its own
            rows = len(tokens)
            width = call_rows(rows, max(rows, batch_size))  # a few row counts: a few compiled programs
            pad = lambda x: np.concatenate([x, np.repeat(x[:1], width - rows, axis=0)])  # noqa: E731
            out = sampler(params, pad(tokens), pad(mask), jax.random.fold_in(sub, next(calls)), sampling, num_samples)
            return jax.tree.map(lambda x: None if x is None else np.asarray(x)[:rows], out)

        out = run(generate, tokenizer, rollout, chunk, num_samples)
        texts += out.texts[:real]
        lengths += out.completions.lengths[:real].tolist()
        records += out.episodes[:real]
    return texts, np.asarray(lengths), records


def correctness(task: Task, prompts: Sequence[Prompt], completions: Sequence[str]) -> np.ndarray:
    """1.0 where the task's correctness reward gives full marks."""
    spec = next(s for s in task.rewards if s.name == task.correct)
    names = sorted({k for p in prompts for k in p.fields})
    fields = {k: [p.fields.get(k) for p in prompts] for k in names}
    # called as in training (keywords, None scores, checks): a None counts as not correct
    scores = RewardManager([spec]).score([p.text for p in prompts], list(completions), fields).per_function[spec.name]
    return (np.asarray(scores) >= 1.0).astype(np.float64)


def evaluate(
    sampler: Sampler,
    params: Any,  # the policy's parameters, as nnx.merge takes them
    tokenizer: Tokenizer,
    task: Task,
    prompts: Sequence[Prompt],
    *,
    pass_k: int = 4,
    samples_per_prompt: int = 8,
    temperature: float = 1.0,
    seed: int = 0,
    rollout: RolloutConfig | None = None,
) -> dict[str, float]:
    """Greedy accuracy and length stats, plus pass@k over `samples_per_prompt` samples.

    With `rollout.environment` (a multi-turn task), every answer is a whole episode; the
    metrics add tool calls and turns per episode (`eval/tool_calls_mean`, `eval/turns_mean`).
    With `rollout.agent`, every answer is the agent's episode against the policy (its result text)."""
    key = jax.random.PRNGKey(seed)
    episodes = rollout is not None and rollout.environment is not None
    agents = rollout is not None and rollout.agent is not None

    def answers(sampling: SamplingParams, key: jax.Array, num_samples: int = 1):
        if agents:
            return generate_agent_episodes(sampler, params, tokenizer, prompts, rollout, sampling=sampling, key=key,
                                           num_samples=num_samples)
        if episodes:
            return generate_episodes(sampler, params, tokenizer, prompts, rollout, sampling=sampling, key=key,
                                     num_samples=num_samples)
        texts, lengths = generate_texts(sampler, params, tokenizer, prompts, max_prompt_tokens=task.max_prompt_tokens,
                                        sampling=sampling, key=key, num_samples=num_samples)
        return texts, lengths, None

    texts, lengths, records = answers(GREEDY, key)
    correct = correctness(task, prompts, texts)
    metrics = {
        "eval/accuracy": float(correct.mean()),
        "eval/length_correct": float(lengths[correct > 0].mean()) if correct.any() else 0.0,
        "eval/length_incorrect": float(lengths[correct == 0].mean()) if (correct == 0).any() else 0.0,
    }
    if records is not None:
        stats = episode_metrics(records)
        metrics["eval/tool_calls_mean"] = stats["episodes/tool_calls_mean"]
        metrics["eval/turns_mean"] = stats["episodes/turns_mean"]
        if agents:  # errors, and the mean of what agents returned as a reward (0 for text results)
            metrics["eval/agent_errors"] = stats["episodes/env_errors"]
            metrics["eval/agent_reward_mean"] = stats["episodes/env_reward_mean"]
    if pass_k and samples_per_prompt:
        texts, _, _ = answers(SamplingParams(temperature=temperature), jax.random.fold_in(key, 1), samples_per_prompt)
        repeated = [p for p in prompts for _ in range(samples_per_prompt)]
        c = correctness(task, repeated, texts).reshape(len(prompts), samples_per_prompt).sum(1)
        metrics[f"eval/pass@{pass_k}"] = float(np.mean([pass_at_k(samples_per_prompt, int(ci), pass_k) for ci in c]))
    return metrics
