"""DAPOLearner: GRPO's pipeline with dynamic sampling in `_sample_groups`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
from algo_grpo import GRPOLearner
from rl_core import CollectionInputs, Groups, Prompt
from rl_core.learner import concat

from algo_dapo.config import DAPOConfig


class DynamicSamplingError(RuntimeError):
    """`max_gen_batches` rounds did not yield enough informative groups (on_max_gen_batches='raise')."""


class DAPOLearner(GRPOLearner):
    """Decoupled Clip and Dynamic sAmpling Policy Optimization (arXiv:2503.14476).

    Overrides only group sampling (`_sample_groups`): generate, drop groups whose correctness
    scores are all equal (all right or all wrong; `filter_reward` chooses the
    scores), keep generating from new prompts (drawn from the supply) until B
    informative groups exist, and carry the surplus over to the next step (the
    supply's carry, which the learner keeps in its state). Carried rows keep the
    behaviour log-probs recorded when they were sampled, so the next step
    weighs them by the importance ratio to the policy that generated them.
    """

    config: DAPOConfig
    _draws_on_scores = True  # more prompts are drawn while the groups score alike: collected whole

    def __init__(self, config: DAPOConfig, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self._filter_by = config.filter_reward or self.reward_manager.correctness
        config.check_reward_names(self.reward_manager.names)

    def _sample_groups(self, prompts: Sequence[Prompt], supply: CollectionInputs, draw: Any = None
                       ) -> tuple[Groups, CollectionInputs]:
        if not self._config.dynamic_sampling:
            return super()._sample_groups(prompts, supply, draw)
        want, carry = len(prompts), supply.carry
        parts = [carry] if carry is not None else []
        carried_in = carry.num_groups if carry is not None else 0
        kept, rounds, sampled, uniform = carried_in, 0, 0, 0
        last: Groups | None = None
        while kept < want:
            if rounds == self._config.max_gen_batches:
                if self._config.on_max_gen_batches == "raise":
                    raise DynamicSamplingError(
                        f"step {self.step + 1}: only {kept} of {want} groups were informative after "
                        f"max_gen_batches={rounds} generation rounds ({uniform} of {sampled} sampled groups had "
                        "equal rewards). Raise max_gen_batches, use on_max_gen_batches='partial', or use "
                        "prompts of a difficulty the policy sometimes solves."
                    )
                break
            if rounds == 0:
                batch = prompts
            else:
                batch, supply = supply.draw(want)
            last = self._score(self._rollout_groups(batch, draw), draw)
            rounds += 1
            is_uniform = last.uniform(self._filter_by)
            sampled += last.num_groups
            uniform += int(is_uniform.sum())
            if kept + int((~is_uniform).sum()) > want:
                # a surplus is carried to the next step: record the log-probs of the policy that
                # sampled it now, for the whole round (one fixed shape, no new compilation)
                last = self._record_behaviour_logprobs(last)
            informative = last.select(np.flatnonzero(~is_uniform))
            parts.append(informative)
            kept += informative.num_groups
        groups = concat([p for p in parts if p.num_groups] or [last], pad_id=self.tokenizer.pad_id)
        if kept >= want:
            carry = groups.select(np.arange(want, kept)) if kept > want else None
            groups = groups.select(np.arange(want))
        else:
            carry = None
            groups = self._fill_masked(groups, last, want)
        # with the batch, as it may be trained on a step later (async rollouts) or after a resume
        sampling = {
            "dapo/gen_rounds": float(rounds),
            "dapo/groups_sampled": float(sampled),
            "dapo/groups_kept": float(min(kept, want)),
            "dapo/groups_carried_in": float(carried_in),
            "dapo/surplus_carried": float(max(kept - want, 0)),
            "groups/uniform_frac": uniform / sampled if sampled else 0.0,
        }
        # live_groups: the groups in the loss (a partial batch ends in masked filler)
        groups = dataclasses.replace(groups, info={**groups.info, "dapo": sampling, "live_groups": min(kept, want)})
        return groups, supply._replace(carry=carry)

    def _fill_masked(self, informative: Groups, last: Groups, want: int) -> Groups:
        """Pad a partial batch to `want` groups with masked-out uniform groups.

        Shapes stay static, and rows with an all-zero mask change neither the
        loss nor its denominator in any aggregation mode.
        """
        missing = want - (informative.num_groups if informative is not last else 0)
        filler = last.select(np.arange(missing) % last.num_groups)
        filler = dataclasses.replace(filler, completion_mask=np.zeros_like(filler.completion_mask))
        parts = [filler] if informative is last else [informative, filler]
        return concat(parts, pad_id=self.tokenizer.pad_id)

    def _group_metrics(self, groups: Groups, advantages: np.ndarray) -> dict[str, float]:
        return {**super()._group_metrics(*self._trained(groups, advantages)), **groups.info.get("dapo", {})}

    def _samples(self, groups: Groups, advantages: np.ndarray) -> list[dict[str, Any]]:
        return super()._samples(*self._trained(groups, advantages))

    def _trained(self, groups: Groups, advantages: np.ndarray) -> tuple[Groups, np.ndarray]:
        """The groups in the loss, for metrics and samples: a partial batch's masked filler
        groups are left out. When no group was kept, the batch is all filler, copies of the
        last round as sampled, and is reported as it is (dapo/groups_kept = 0 says so)."""
        n = groups.info.get("live_groups")
        if not n or n >= groups.num_groups:
            return groups, advantages
        return groups.select(np.arange(n)), advantages[: n * self._config.group_size]
