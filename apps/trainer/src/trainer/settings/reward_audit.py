"""`reward_audit.*`: the reward audits' limits (rewards.auditor.AuditLimits), the probe, and the switch.

The limits' fields and their descriptions are AuditLimits' own (one place); this section adds
whether the audits run at all and how many prompts the start-of-run probe scores.
See docs/reward-audits.md.
"""

from __future__ import annotations

import dataclasses

from rewards.auditor import AuditLimits
from rl_core import check, Config, ConfigError


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewardAuditSettings(Config, AuditLimits):
    enabled: bool = True
    """Audit each step's rewards (reward_audit/* metrics, warnings) and probe them at the start; false: none of it."""
    probe_prompts: int = 8
    """Training prompts the start-of-run probe scores adversarial completions for (0: no probe)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            AuditLimits.__post_init__(self)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        check(isinstance(self.probe_prompts, int) and self.probe_prompts >= 0, self, "probe_prompts",
              "must be an int >= 0 (0 turns the probe off)")

    def limits(self) -> AuditLimits:
        return AuditLimits(**{f.name: getattr(self, f.name) for f in dataclasses.fields(AuditLimits)})
