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
checkpoints written before this group); with the group left at its default it becomes that
correction, and setting both otherwise is refused unless they agree.

Default: the `token_tis` preset (C = 2) for every run, synchronous or async, chosen from the
measurement in docs/rollout-correction.md: it weighs without dropping a token, is 1 to float32
rounding where the engine matches the trainer, costs no forward pass on an on-policy step, and
learned as well as no correction and the other candidates under bfloat16 and async rollouts.
`mode=off` (or `preset=off`) turns it off.
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


DEFAULT_PRESET = "token_tis"
"""The correction of a run that sets none (see the module docstring for the measurement)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutCorrection(Config):
    """Which rollout correction the objective applies (rl_core.math.rollout_correction), and its thresholds."""

    preset: str | None = DEFAULT_PRESET
    """A name of PRESETS (off, token_tis, seq_is, token_reject, seq_reject, geo_reject, icepop,
    seq_mask); its mode and thresholds, each overridden by `mode`, `cap` or `lower` when set.
    Default token_tis (C = 2); None = no preset (then `mode`, or off)."""
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


def fold_alias(config: Any) -> None:
    """`tis_cap` and `rollout_correction` name one setting: with the group at its default (or off)
    `tis_cap = C` becomes `rollout_correction` token_tis at C (written into the frozen `config`);
    both set otherwise only when they agree."""
    tis_cap = getattr(config, "tis_cap", None)
    correction = getattr(config, "rollout_correction", None)
    if tis_cap is None or correction is None:
        return
    if correction == RolloutCorrection() or not correction.on:
        object.__setattr__(config, "rollout_correction", RolloutCorrection.token_tis(tis_cap))
        return
    if correction.mode != "token_tis" or correction.cap != tis_cap:
        raise ConfigError(
            f"{type(config).__name__}.tis_cap = {tis_cap!r} and rollout_correction (mode={correction.mode!r}, "
            f"cap={correction.cap!r}) both set: tis_cap is the old name of rollout_correction.mode=token_tis "
            f"with that cap; set only rollout_correction"
        )


def resolve_correction(config: Any) -> RolloutCorrection:
    """The correction a run of `config` (a PolicyGradientConfig) applies: its `rollout_correction`
    (with `tis_cap` folded in), or the default for a config without the group."""
    correction = getattr(config, "rollout_correction", None)
    return correction if correction is not None else RolloutCorrection()
