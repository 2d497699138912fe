"""The reward audits of a `trainer train` run: the auditor the learner calls each step, the probe
at the start, and the audit's part of the run's report (summary.json). The audits themselves are
rewards.audits / rewards.auditor; docs/reward-audits.md explains them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from rewards import RewardManager
from rewards.auditor import RewardAuditor, summarize
from rewards.audits import probe_rewards
from rl_core import environment_factory, Prompt
from rl_core.episodes import EpisodeLimits, first_turn_episodes, StepResult

from trainer.settings import RunSettings
from trainer.tasks import Task


def auditor(settings: RunSettings, task: Task, log: Callable[[str], None]) -> RewardAuditor | None:
    """What the learner calls with each step's rewards (None with reward_audit.enabled = false)."""
    audit = settings.reward_audit
    return RewardAuditor(audit.limits(), correctness=task.correct, log=log) if audit.enabled else None


def probe(manager: RewardManager, task: Task, settings: RunSettings, tokenizer: Any,
          log: Callable[[str], None]) -> dict[str, Any] | None:
    """Score the adversarial completions (empty, the prompt echoed, a repetition to the length limit)
    of the first `reward_audit.probe_prompts` training prompts with each of the run's reward
    functions alone; one log line for each function that pays them or fails on them."""
    audit = settings.reward_audit
    if not audit.enabled or not audit.probe_prompts:
        return None
    prompts = task.train[: audit.probe_prompts]
    specs = {spec.name: spec for spec in manager.specs}

    def score(name, texts, completions, fields):  # the function alone: one bad function spoils no other's
        ids = {"completion_ids": [list(tokenizer.encode(c, add_bos=False)) for c in completions]}  # as in training
        return RewardManager([specs[name]]).score(texts, completions, ids | dict(fields)).per_function[name]

    fields = {k: [p.fields.get(k) for p in prompts] for k in sorted({k for p in prompts for k in p.fields})}
    result = probe_rewards(score, list(specs), [p.text for p in prompts], fields,
                           max_new_tokens=settings.rollout.max_new_tokens,
                           length_of=lambda text: len(tokenizer.encode(text)),
                           completion_fields=_episodes(settings, prompts, tokenizer))
    for name, kinds in result.flagged.items():
        paid = ", ".join(f"{kind} {result.mean[name][kind]:.2f} ({result.paid[name][kind]}/{result.prompts} prompts)"
                         for kind in kinds)
        log(f"reward audit probe: {name!r} pays adversarial completions (mean score, prompts paid): {paid}")
    for name, error in result.failed.items():
        log(f"reward audit probe: {name!r} failed on an adversarial completion: {error}")
    if not result.flagged and not result.failed:
        log(f"reward audit probe: no reward pays an empty, echoed or cut-off completion ({result.prompts} prompts)")
    return result.to_json()


def _episodes(settings: RunSettings, prompts: Sequence[Prompt], tokenizer: Any,
              ) -> Callable[[Sequence[int], Sequence[str]], dict[str, list[Any]]] | None:
    """For a run of episodes, each probed completion's `episode` field, as its reward functions get it in
    training: the episode whose first model turn it is, answered by the run's environment (an agent run's
    probe runs no agent: the turn alone, reward 0); None for single-turn completions."""
    rollout = settings.rollout
    if rollout.environment is None and rollout.agent is None:
        return None
    make_env = (environment_factory(rollout.environment, rollout.environment_options) if rollout.environment
                else _TurnAlone)

    def episodes(owner: Sequence[int], completions: Sequence[str]) -> dict[str, list[Any]]:
        records = first_turn_episodes(tokenizer, [prompts[i] for i in owner], completions, make_env,
                                      limits=EpisodeLimits.from_rollout(rollout))
        return {"episode": [r.to_json() for r in records]}

    return episodes


class _TurnAlone:
    """An environment that ends the episode after its first turn, paying nothing."""

    stop_strings = ()
    state = None

    def reset(self, prompt: Prompt) -> str:
        return ""

    def step(self, text: str) -> StepResult:
        return StepResult("", 0.0, True)


def report(history: Iterable[Mapping[str, float]], probed: dict[str, Any] | None, settings: RunSettings, task: Task,
           log: Callable[[str], None]) -> dict[str, Any]:
    """The audit's part of summary.json: the probe, and each audit that tripped in the logged steps
    (steps, first step, worst value); one log line for each that tripped."""
    audit = settings.reward_audit
    tripped = summarize(history, audit.limits(), correctness=task.correct) if audit.enabled else {}
    for key, seen in tripped.items():
        log(f"reward audit: {key} tripped on {seen['steps']:.0f} logged steps (first step {seen['first_step']:.0f}, "
            f"worst {seen['worst']:.2f})")
    return {"enabled": audit.enabled, "probe": probed, "tripped": tripped}
