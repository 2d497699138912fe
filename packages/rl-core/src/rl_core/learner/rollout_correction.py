"""RolloutCorrection: the settings group `algorithm.rollout_correction.*` of every policy-gradient
algorithm, its named presets, and what a run uses (`resolve_correction`).

One mode at a time of rl_core.math.rollout_correction (see there for each formula and its
source), applied in the shared objective (rl_core.train.objective) to every algorithm:

    algorithm.rollout_correction.preset=seq_mask               TRL's default: sequence-level mask, C = 3
    algorithm.rollout_correction.mode=icepop                   IcePop with its defaults [0.5, 5]
    algorithm.rollout_correction.mode=token_reject algorithm.rollout_correction.cap=1.5

`preset` names a (mode, cap, lower) of `PRESETS`; `mode`, `cap` and `lower` set explicitly
override the preset's, and a mode's unset thresholds are its same-named preset's. After
construction `mode`, `cap` and `lower` hold the values the run uses, so a config round-trips
through to_dict / from_dict unchanged.

The older `algorithm.tis_cap = C` stays an alias of `mode=token_tis, cap=C` (configs and
checkpoints written before this group); setting both is refused unless they agree. Default:
off for synchronous rollouts (no measurement yet says another default is better, issue #45);
with `training.async_rollout != "off"` and nothing set, the run uses `ASYNC_DEFAULT`
(token_tis, C = 2), what a run needed `tis_cap=2.0` for before.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rl_core.config import Config, ConfigError, check
from rl_core.math.rollout_correction import MODES, TRUNCATING


@dataclasses.dataclass(frozen=True)
class Preset:
    """A named rollout correction: its mode and thresholds, and where they come from."""

    mode: str
    cap: float | None
    lower: float | None
    source: str


PRESETS: dict[str, Preset] = {
    "off": Preset("off", None, None, "no correction"),
    "token_tis": Preset("token_tis", 2.0, None, "verl decoupled_token_is (threshold 2.0); Yao et al. 2025"),
    "seq_is": Preset("seq_is", 2.0, None, "verl decoupled_seq_is (Seq-TIS, threshold 2.0)"),
    "token_reject": Preset("token_reject", 2.0, 0.5, "verl rollout_rs='token' with threshold 2.0 (lower 1/2)"),
    "seq_reject": Preset("seq_reject", 2.0, 0.5, "verl decoupled_seq_is_rs's rejection (Seq-MIS, '0.5_2.0')"),
    "geo_reject": Preset("geo_reject", 1.001, 0.999, "verl decoupled_geo_rs (Geo-RS, '0.999_1.001')"),
    "icepop": Preset("icepop", 5.0, 0.5, "IcePop (Ring-1T, arXiv:2510.18855): [alpha, beta] = [0.5, 5]"),
    "seq_mask": Preset("seq_mask", 3.0, None, "TRL GRPOConfig default: vllm_importance_sampling_mode="
                       "'sequence_mask', vllm_importance_sampling_cap=3.0"),
}
"""Named presets; the preset of a mode's own name holds that mode's default thresholds."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutCorrection(Config):
    """Which rollout correction the objective applies (rl_core.math.rollout_correction), and its thresholds."""

    preset: str | None = None
    """A name of PRESETS (off, token_tis, seq_is, token_reject, seq_reject, geo_reject, icepop,
    seq_mask); its mode and thresholds, each overridden by `mode`, `cap` or `lower` when set."""
    mode: str | None = None
    """off | token_tis | seq_is | token_reject | seq_reject | geo_reject | icepop | seq_mask;
    None = the preset's, or off."""
    cap: float | None = None
    """C of the truncating modes (token_tis, seq_is; >= 1), the upper bound of the others
    (>= 1); None = the mode's default (its preset's)."""
    lower: float | None = None
    """The lower bound of the band modes (token_reject, seq_reject, geo_reject, icepop, seq_mask;
    in [0, 1]); None = the mode's default (1 / cap for the rejection modes as verl, 0.5 for
    icepop, none for seq_mask as TRL)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.preset is not None:
            check(self.preset in PRESETS, self, "preset", f"must be one of {tuple(PRESETS)}")
        base = PRESETS[self.preset] if self.preset is not None else None
        mode = self.mode if self.mode is not None else (base.mode if base is not None else "off")
        check(mode in MODES, self, "mode", f"must be one of {MODES}")
        defaults = base if base is not None and base.mode == mode else PRESETS[mode]
        cap = self.cap if self.cap is not None else defaults.cap
        lower = self.lower if self.lower is not None else defaults.lower
        if mode in ("token_reject", "seq_reject", "geo_reject") and self.lower is None and self.cap is not None:
            lower = 1.0 / cap  # verl: the lower threshold defaults to the reciprocal of the upper one
        object.__setattr__(self, "mode", mode)
        object.__setattr__(self, "cap", cap)
        object.__setattr__(self, "lower", lower)
        if mode == "off":
            check(cap is None and lower is None, self, "cap" if cap is not None else "lower",
                  "has no effect with mode off: pick a mode (or a preset)")
        elif mode in TRUNCATING:
            check(cap >= 1.0, self, "cap", "must be >= 1 (a weight of 1 means no mismatch)")
            check(lower is None, self, "lower", f"has no effect with mode {mode} (it truncates from above only)")
        else:
            check(cap >= 1.0, self, "cap", "must be >= 1: the band [lower, cap] must hold 1 (no mismatch)")
            check(lower is None or 0.0 <= lower <= 1.0, self, "lower",
                  "must be in [0, 1]: the band [lower, cap] must hold 1 (no mismatch)")

    @property
    def on(self) -> bool:
        return self.mode != "off"

    @classmethod
    def token_tis(cls, cap: float) -> RolloutCorrection:
        """The token-level truncated IS of `tis_cap = cap`."""
        return cls(mode="token_tis", cap=cap)


ASYNC_DEFAULT = RolloutCorrection(preset="token_tis", cap=2.0)
"""What an async run (training.async_rollout != "off") uses when neither `rollout_correction`
nor `tis_cap` is set: token-level TIS with C = 2 (the cap async runs were told to set)."""


def check_alias(config: Any) -> None:
    """`tis_cap` and `rollout_correction` name one setting: both set only when they agree."""
    tis_cap = getattr(config, "tis_cap", None)
    correction = getattr(config, "rollout_correction", None)
    if tis_cap is None or correction is None or not correction.on:
        return
    if correction.mode != "token_tis" or correction.cap != tis_cap:
        raise ConfigError(
            f"{type(config).__name__}.tis_cap = {tis_cap!r} and rollout_correction (mode={correction.mode!r}, "
            f"cap={correction.cap!r}) both set: tis_cap is the old name of rollout_correction.mode=token_tis "
            f"with that cap; set only rollout_correction"
        )


def resolve_correction(config: Any, *, async_rollout: str = "off") -> RolloutCorrection:
    """The correction a run of `config` (a PolicyGradientConfig) applies: `rollout_correction`
    when on, else `tis_cap` (token_tis with that cap), else ASYNC_DEFAULT for async rollouts,
    else off."""
    correction = getattr(config, "rollout_correction", None) or RolloutCorrection()
    if correction.on:
        return correction
    tis_cap = getattr(config, "tis_cap", None)
    if tis_cap is not None:
        return RolloutCorrection.token_tis(tis_cap)
    if async_rollout != "off":
        return ASYNC_DEFAULT
    return correction
