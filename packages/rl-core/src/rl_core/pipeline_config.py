"""PolicyGradientConfig: every knob the policy-gradient pipeline (rl_core.learner.pipeline) reads.

Its defaults are GRPO's (Shao et al. 2024, arXiv:2402.03300), the algorithm the
variants change: GRPOConfig (package algo-grpo) keeps them as they are, and each variant's
config (DAPO's, PPO's, ...) overrides the ones it changes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import ClassVar

import jax
import jax.numpy as jnp

from rl_core import registry
from rl_core.config import AlgorithmConfig, check, check_registered
from rl_core.correction_config import RolloutCorrection, fold_alias


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyGradientConfig(AlgorithmConfig):
    """Sampling G completions per prompt, advantages, the clipped surrogate, KL and importance
    sampling: the fields of rl_core.learner.pipeline.PolicyGradientLearner, with GRPO's defaults."""

    estimator_category: ClassVar[str] = "advantage_estimator"
    """Registry category of `advantage_estimator`: "advantage_estimator" compares the G completions
    of a prompt (so G >= 2); "token_advantage_estimator" takes a critic's values (PPO, G >= 1)."""
    kl_in_rewards: ClassVar[bool] = False
    """True: the KL penalty (beta) goes into the rewards, which read the behaviour log-probs (PPO);
    False: it is a term of the loss (rl_core.train.behaviour.LogprobPasses)."""

    beta: float = 0.04
    """KL coefficient; 0 runs no reference model and keeps no reference parameters."""
    kl_estimator: str = "k3"
    """KL estimator name: k1, k2 or k3 (Schulman's unbiased, non-negative estimator)."""
    epsilon_low: float = 0.2
    """Lower clip: ratios below 1 - epsilon_low are clipped for negative advantages (1 = no lower bound)."""
    epsilon_high: float = 0.2
    """Upper clip: ratios above 1 + epsilon_high are clipped for positive advantages."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 bounding the loss of negative advantages (None = off)."""
    loss_agg_mode: str = "seq-mean-token-mean"
    """Aggregation of per-token losses (a `loss_aggregation` name)."""
    advantage_estimator: str = "grpo"
    """Rewards -> advantages (an `advantage_estimator` name)."""
    policy_loss: str = "grpo"
    """Per-token policy loss (a `policy_loss` name)."""
    mask_truncated_completions: bool = False
    """Give completions that hit max_new_tokens mask 0 in the loss (overlong filtering)."""
    tis_cap: float | None = None
    """C of truncated importance sampling against the sampler/trainer mismatch (Yao et al. 2025):
    each token's policy loss is weighed by min(pi_old_trainer / pi_sampler, C). The older name of
    rollout_correction.mode=token_tis with cap C (kept for configs and checkpoints): with that group
    left at its default it becomes it. None = the group decides."""
    rollout_correction: RolloutCorrection = dataclasses.field(default_factory=RolloutCorrection)
    """The correction of the sampler/trainer mismatch and staleness (docs/rollout-correction.md):
    a preset (token_tis, seq_mask = TRL's default, icepop, ...) or a mode with its thresholds.
    Default: token_tis with C = 2, synchronous and async alike; mode=off turns it off."""
    entropy_top_fraction: float = 1.0
    """rho of high-entropy token selection ("Beyond the 80/20 Rule", arXiv:2506.01939; TRL's
    top_entropy_quantile): the policy-gradient term only on the tokens whose entropy under the
    current policy is at or above the (1 - rho)-quantile of the micro-batch's real tokens; the
    loss's denominator still counts every real token (rl_core.train.objective.high_entropy_mask).
    1.0 = every token (off); the paper keeps 0.2."""
    distill_coef: float = 0.0
    """On-policy distillation: each token's advantage gains distill_coef * (log pi_teacher(y_t) -
    log pi_old(y_t)), the negative sampled reverse KL to a frozen teacher on the student's own tokens
    (rl_core.math.distillation; Thinking Machines' "On-Policy Distillation", slime's opd_kl_coef).
    0 = off: no teacher is kept and no teacher pass runs. Beside any estimator's advantage (GRPO +
    distillation is this setting); with advantage_estimator="zero" it is distillation alone (algo-opd)."""
    teacher: str | None = None
    """Where the distillation teacher comes from, for the app that builds the learner (the trainer: a
    Hugging Face model folder or a trainer run folder, sharing the student's tokenizer); the learner
    itself takes the module (`teacher=`). Only with distill_coef > 0."""

    routing_replay: str = "off"
    """A mixture of experts' routing in the learner's passes (docs/mixture-of-experts.md): "off", each
    pass's routers choose; "rollout", the behaviour, reference and update passes take the experts the
    rollout engine's routers chose at the position that sampled each completion token (routing replay,
    R3), so that a routing flip between engine and trainer does not show up as an importance ratio.
    Prompt positions before the last route freely. Needs a model with experts, an engine that records
    its routing (static or paged) and training.packing off."""
    router_aux_loss_coef: float = 0.0
    """The router's load-balancing loss (Switch Transformer's E * sum_e f_e P_e, as transformers
    computes it for Qwen3-MoE and gpt-oss: rl_core.math.routing) times this, added to the policy's
    loss over the positions that predict real completion tokens, every layer pooled; logged as
    train/router_aux_loss. 0 = off (Qwen3-MoE's published configs say 0.001)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.routing_replay in ("off", "rollout"), self, "routing_replay",
              "must be 'off' (each pass routes) or 'rollout' (the passes replay the rollout's experts)")
        check(self.router_aux_loss_coef >= 0.0, self, "router_aux_loss_coef", "must be >= 0 (0 = off)")
        if self.estimator_category == "advantage_estimator":
            check(self.group_size >= 2, self, "group_size", "must be >= 2")
        check(self.beta >= 0.0, self, "beta", "must be >= 0")
        check(0.0 <= self.epsilon_low <= 1.0, self, "epsilon_low", "must be in [0, 1] (1 = no lower bound)")
        check(self.epsilon_high >= 0.0, self, "epsilon_high", "must be >= 0")
        check(self.dual_clip is None or self.dual_clip > 1.0, self, "dual_clip", "must be > 1 or None")
        check(self.tis_cap is None or self.tis_cap >= 1.0, self, "tis_cap", "must be >= 1 or None (off)")
        fold_alias(self)
        check(0.0 < self.entropy_top_fraction <= 1.0, self, "entropy_top_fraction",
              "must be in (0, 1]: the fraction of each micro-batch's tokens, by entropy, "
              "that the policy loss keeps (1 = all)")
        check(self.distill_coef >= 0.0, self, "distill_coef", "must be >= 0 (0 = no distillation)")
        check(self.teacher is None or self.distill_coef > 0, self, "teacher",
              "a teacher is only read with distill_coef > 0; set algorithm.distill_coef (e.g. 1.0) or unset it")
        check_registered(self, "kl_estimator", "kl_estimator")
        check_registered(self, "advantage_estimator", self.estimator_category)
        check_registered(self, "policy_loss", "policy_loss")
        if self.distill_coef > 0 or self.estimator_category == "token_advantage_estimator":
            why = ("distill_coef > 0 gives each token an advantage of its own" if self.distill_coef > 0
                   else f"{self.advantage_estimator} gives per-token advantages")
            check(_takes_token_advantages(registry.get("policy_loss", self.policy_loss)), self, "policy_loss",
                  f"takes one advantage per completion, but {why}; use a per-token policy loss "
                  "(GSPO's per-token form: algorithm.policy_loss=gspo_token)")


@functools.cache
def _takes_token_advantages(policy_loss: Callable) -> bool:
    """Whether a registered policy loss takes advantages [B, T] (traced on abstract [2, 3] arrays,
    nothing computed): a per-sequence loss (GSPO's) refuses them, which would otherwise surface
    as a shape error inside the first update."""
    tokens = jax.ShapeDtypeStruct((2, 3), jnp.float32)
    try:
        jax.eval_shape(functools.partial(policy_loss, eps_low=0.2, eps_high=0.2), tokens, tokens, tokens, tokens)
    except (ValueError, TypeError):
        return False
    return True
