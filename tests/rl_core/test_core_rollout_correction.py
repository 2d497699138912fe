"""rl_core.math.rollout_correction: every mode by hand, and against literal numpy transcriptions of
verl's (verl/trainer/ppo/rollout_corr_helper.py) and TRL's (GRPOTrainer, vllm_importance_sampling_mode)
formulas on random inputs."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rl_core.math import rollout_correction as rc
from tolerances import approx, bound, close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])


def _inputs(ratios, mask):
    """sampler_logp = -1 everywhere, old_logp = sampler + log(ratio): rho_t = ratio_t exactly
    (NaN at padding, which must never reach an output)."""
    ratios = np.asarray(ratios, np.float32)
    mask = np.asarray(mask, np.float32)
    sampler = np.where(mask > 0, -1.0, np.nan).astype(np.float32)
    old = np.where(mask > 0, sampler + np.log(np.where(mask > 0, ratios, 1.0)), np.nan).astype(np.float32)
    return jnp.asarray(old), jnp.asarray(sampler), jnp.asarray(mask)


# Two rows of three tokens; the second row's last token is padding.
RATIOS = [[1.5, 3.0, 0.4], [0.9, 1.2, 1.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


@VARIANTS
def test_token_tis_by_hand(variant):
    w, keep = variant(functools.partial(rc.token_tis, cap=2.0))(*_inputs(RATIOS, MASK))
    # min(rho, 2): [1.5, 2 (3 truncated), 0.4], [0.9, 1.2, 1 at padding]
    np.testing.assert_allclose(w, [[1.5, 2.0, 0.4], [0.9, 1.2, 1.0]], **close(atol=1e-6))
    np.testing.assert_array_equal(keep, [[1, 1, 1], [1, 1, 0]])


@VARIANTS
def test_seq_is_by_hand(variant):
    w, keep = variant(functools.partial(rc.seq_is, cap=2.0))(*_inputs(RATIOS, MASK))
    # row 0: 1.5 * 3 * 0.4 = 1.8 < 2 -> 1.8 on every token; row 1: 0.9 * 1.2 = 1.08 (padding not in the product)
    np.testing.assert_allclose(w, [[1.8, 1.8, 1.8], [1.08, 1.08, 1.0]], **close(atol=1e-5))
    np.testing.assert_array_equal(keep, [[1, 1, 1], [1, 1, 0]])
    w, _ = rc.seq_is(*_inputs(RATIOS, MASK), cap=1.5)
    # 1.8 truncated to 1.5; 1.08 kept
    np.testing.assert_allclose(w[:, 0], [1.5, 1.08], **close(atol=1e-5))


@VARIANTS
def test_token_reject_by_hand(variant):
    w, keep = variant(functools.partial(rc.token_reject, upper=2.0))(*_inputs(RATIOS, MASK))
    # band [1/2, 2]: 1.5 in, 3 out (above), 0.4 out (below); 0.9, 1.2 in; padding never kept
    np.testing.assert_array_equal(keep, [[1, 0, 0], [1, 1, 0]])
    np.testing.assert_allclose(w, np.ones((2, 3)), **close())
    _, keep = rc.token_reject(*_inputs(RATIOS, MASK), upper=4.0, lower=0.3)
    # band [0.3, 4]: every real token in
    np.testing.assert_array_equal(keep, [[1, 1, 1], [1, 1, 0]])


@VARIANTS
def test_seq_reject_by_hand(variant):
    w, keep = variant(functools.partial(rc.seq_reject, upper=1.5))(*_inputs(RATIOS, MASK))
    # products 1.8 (row 0, above 1.5: the whole row out) and 1.08 (in [1/1.5, 1.5])
    np.testing.assert_array_equal(keep, [[0, 0, 0], [1, 1, 0]])
    np.testing.assert_allclose(w, np.ones((2, 3)), **close())


@VARIANTS
def test_geo_reject_by_hand(variant):
    w, keep = variant(functools.partial(rc.geo_reject, upper=1.2))(*_inputs(RATIOS, MASK))
    # geometric means: row 0 (1.8)^(1/3) = 1.2164 > 1.2 -> out; row 1 (1.08)^(1/2) = 1.0392 in [1/1.2, 1.2]
    np.testing.assert_array_equal(keep, [[0, 0, 0], [1, 1, 0]])
    _, keep = rc.geo_reject(*_inputs(RATIOS, MASK), upper=1.25)
    np.testing.assert_array_equal(keep, [[1, 1, 1], [1, 1, 0]])  # 1.2164 <= 1.25
    np.testing.assert_allclose(np.exp(rc.geometric_log_ratio(*_inputs(RATIOS, MASK))),
                               [1.8 ** (1 / 3), 1.08 ** 0.5], **close(rtol=1e-6))


@VARIANTS
def test_icepop_by_hand(variant):
    w, keep = variant(functools.partial(rc.icepop, lower=0.5, upper=2.0))(*_inputs(RATIOS, MASK))
    # M(rho; 0.5, 2): 1.5 -> 1.5, 3 -> 0 (above), 0.4 -> 0 (below); 0.9, 1.2 kept as themselves
    np.testing.assert_allclose(w, [[1.5, 0.0, 0.0], [0.9, 1.2, 1.0]], **close(atol=1e-6))
    np.testing.assert_array_equal(keep, [[1, 0, 0], [1, 1, 0]])
    w, _ = rc.icepop(*_inputs(RATIOS, MASK))  # the paper's [0.5, 5]: only 0.4 falls out
    np.testing.assert_allclose(w[0], [1.5, 3.0, 0.0], **close(atol=1e-6))


@VARIANTS
def test_seq_mask_by_hand(variant):
    w, keep = variant(functools.partial(rc.seq_mask, cap=1.5))(*_inputs(RATIOS, MASK))
    # TRL sequence_mask, C = 1.5: row 0's product 1.8 > 1.5 -> weight 0; row 1's 1.08 is the weight
    np.testing.assert_allclose(w, [[0.0, 0.0, 0.0], [1.08, 1.08, 1.0]], **close(atol=1e-5))
    np.testing.assert_array_equal(keep, [[0, 0, 0], [1, 1, 0]])
    # a lower bound (TRL has none): the product 0.5 * 1.5 = 0.75 is below 0.8
    args = _inputs([[0.5, 1.5]], [[1, 1]])
    assert rc.seq_mask(*args, cap=3.0)[1].tolist() == [[True, True]]
    assert rc.seq_mask(*args, cap=3.0, lower=0.8)[1].tolist() == [[False, False]]


def test_off_and_dispatch():
    args = _inputs(RATIOS, MASK)
    w, keep = rc.rollout_correction("off", *args)
    np.testing.assert_array_equal(w, np.ones((2, 3)))
    np.testing.assert_array_equal(keep, [[1, 1, 1], [1, 1, 0]])
    for mode, direct in [("token_tis", rc.token_tis(*args, cap=2.0)), ("seq_is", rc.seq_is(*args, cap=2.0)),
                         ("token_reject", rc.token_reject(*args, upper=2.0)),
                         ("seq_reject", rc.seq_reject(*args, upper=2.0)),
                         ("geo_reject", rc.geo_reject(*args, upper=2.0)),
                         ("icepop", rc.icepop(*args, upper=2.0)), ("seq_mask", rc.seq_mask(*args, cap=2.0))]:
        got = rc.rollout_correction(mode, *args, cap=2.0)
        np.testing.assert_array_equal(got[0], direct[0], err_msg=mode)
        np.testing.assert_array_equal(got[1], direct[1], err_msg=mode)
    with pytest.raises(ValueError, match="must be one of"):
        rc.rollout_correction("tis", *args, cap=2.0)
    assert set(rc.DROPS_FROM_DENOMINATOR) == {"token_reject", "seq_reject", "geo_reject"}


def test_thresholds_are_checked():
    args = _inputs(RATIOS, MASK)
    with pytest.raises(ValueError, match=">= 1"):
        rc.token_tis(*args, cap=0.5)
    with pytest.raises(ValueError, match="must hold 1"):
        rc.token_reject(*args, upper=2.0, lower=1.5)
    with pytest.raises(ValueError, match="must hold 1"):
        rc.icepop(*args, lower=0.5, upper=0.9)


@pytest.mark.parametrize("mode", [m for m in rc.MODES if m != "off"])
def test_no_gradient_and_finite_on_padding(mode):
    old, sampler, mask = _inputs(RATIOS, MASK)

    def total(o):
        w, keep = rc.rollout_correction(mode, o, sampler, mask, cap=2.0)
        return jnp.sum(w * keep)

    assert np.array_equal(np.asarray(jax.grad(total)(jnp.nan_to_num(old))), np.zeros((2, 3)))
    w, keep = rc.rollout_correction(mode, old, sampler, mask, cap=2.0)
    assert np.isfinite(np.asarray(w)).all()
    assert not bool(keep[1, 2])  # padding


def test_huge_log_ratios_stay_finite():
    # a token log-ratio of +-50 is clamped at 20 (verl's SAFETY_BOUND) before the exponent
    old = jnp.asarray([[50.0, -50.0]])
    sampler = jnp.zeros((1, 2))
    mask = jnp.ones((1, 2))
    w, _ = rc.icepop(old, sampler, mask, lower=0.0, upper=1e10)
    np.testing.assert_allclose(w, [[np.exp(20.0), np.exp(-20.0)]], **close(rtol=1e-5))
    w, _ = rc.seq_is(old, sampler, mask, cap=3.0)  # sum 0 -> ratio 1
    np.testing.assert_allclose(w, [[1.0, 1.0]], **close(atol=1e-6))


def test_metrics_by_hand():
    args = _inputs(RATIOS, MASK)
    w, keep = rc.token_tis(*args, cap=2.0)
    m = {k: float(s) / float(c) for k, (s, c) in rc.correction_metrics("token_tis", w, keep, args[2], cap=2.0).items()}
    # 5 real tokens: weights 1.5 + 2 + 0.4 + 0.9 + 1.2 = 6.0 -> 1.2; one truncated (3 -> 2): 1/5; none dropped
    assert m == approx({"rollout/weight_mean": 1.2, "rollout/corrected_frac": 0.2,
                               "rollout/masked_frac": 0.0, "rollout/seq_masked_frac": 0.0})
    w, keep = rc.token_reject(*args, upper=2.0)
    m = {k: float(s) / float(c) for k, (s, c) in rc.correction_metrics("token_reject", w, keep, args[2]).items()}
    # 3 and 0.4 dropped: 2/5 tokens; row 0 has a dropped token, row 1 none: 1/2 rows
    assert m["rollout/masked_frac"] == approx(0.4)
    assert m["rollout/seq_masked_frac"] == approx(0.5)
    assert m["rollout/corrected_frac"] == 0.0


# -- literal numpy transcriptions of verl and TRL --------------------------------------------------------


def _verl_masked_sum(values, mask, axis=None):
    return (values * mask).sum(axis=axis)


def _verl_masked_mean(values, mask, axis=None):
    return (values * mask).sum(axis=axis) / (mask.sum(axis=axis) + 1e-8)


SAFETY_BOUND = 20.0


def verl_is_weights(old, rollout, mask, level, threshold):
    """compute_rollout_correction_weights: rollout_is in {"token", "sequence"}, a float threshold (TIS)
    or (lower, upper) (IcePop)."""
    log_ratio = old - rollout
    if level == "token":
        raw = np.exp(np.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:
        s = _verl_masked_sum(log_ratio, mask, axis=-1)[:, None]
        raw = np.broadcast_to(np.exp(np.clip(s, -SAFETY_BOUND, SAFETY_BOUND)), log_ratio.shape)
    raw = raw * mask
    if isinstance(threshold, tuple):
        lower, upper = threshold
        kept = (raw >= lower) & (raw <= upper)
        return np.where(kept, raw, np.zeros_like(raw)), mask  # IcePop: response_mask unchanged
    return np.minimum(raw, threshold), mask


def verl_rejection_mask(old, rollout, mask, rollout_rs, upper, lower=None):
    """compute_rollout_rejection_mask: rollout_rs in {"token", "sequence", "geometric"}."""
    log_ratio = old - rollout
    lower = lower if lower is not None else 1.0 / upper
    if rollout_rs == "token":
        w = np.exp(np.clip(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    elif rollout_rs == "sequence":
        s = _verl_masked_sum(log_ratio, mask, axis=-1)[:, None]
        w = np.broadcast_to(np.exp(np.clip(s, -SAFETY_BOUND, SAFETY_BOUND)), log_ratio.shape)
    else:
        m = _verl_masked_mean(log_ratio, mask, axis=-1)[:, None]
        w = np.broadcast_to(np.exp(np.clip(m, -SAFETY_BOUND, SAFETY_BOUND)), log_ratio.shape)
    keep = ((w >= lower) & (w <= upper)).astype(np.float64)
    return np.ones_like(w), mask * keep  # modified_response_mask


def trl_sequence_mask(old, sampling, mask, cap):
    """GRPOTrainer, vllm_importance_sampling_mode="sequence_mask"."""
    per_token_logps_diff = (old - sampling) * mask
    logps_diff = per_token_logps_diff.sum(axis=-1, keepdims=True)
    ratio = np.exp(logps_diff)
    ratio = np.where(ratio > cap, 0.0, ratio)
    return np.broadcast_to(ratio, old.shape), mask


CASES = [
    ("token_tis", dict(cap=2.0), lambda o, s, m: verl_is_weights(o, s, m, "token", 2.0)),
    ("token_tis", dict(cap=1.2), lambda o, s, m: verl_is_weights(o, s, m, "token", 1.2)),
    ("seq_is", dict(cap=2.0), lambda o, s, m: verl_is_weights(o, s, m, "sequence", 2.0)),
    ("token_reject", dict(cap=1.3), lambda o, s, m: verl_rejection_mask(o, s, m, "token", 1.3)),
    ("token_reject", dict(cap=1.5, lower=0.6), lambda o, s, m: verl_rejection_mask(o, s, m, "token", 1.5, 0.6)),
    ("seq_reject", dict(cap=2.0, lower=0.5), lambda o, s, m: verl_rejection_mask(o, s, m, "sequence", 2.0, 0.5)),
    ("geo_reject", dict(cap=1.05), lambda o, s, m: verl_rejection_mask(o, s, m, "geometric", 1.05)),
    ("icepop", dict(cap=1.3, lower=0.8), lambda o, s, m: verl_is_weights(o, s, m, "token", (0.8, 1.3))),
    ("icepop", dict(), lambda o, s, m: verl_is_weights(o, s, m, "token", (0.5, 5.0))),
    ("seq_mask", dict(cap=3.0), lambda o, s, m: trl_sequence_mask(o, s, m, 3.0)),
]


@pytest.mark.parametrize("mode,kwargs,reference", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_against_verl_and_trl_transcriptions(mode, kwargs, reference):
    rng = np.random.default_rng(7)
    b, t = 16, 12
    sampler = rng.uniform(-4.0, -0.05, size=(b, t)).astype(np.float32)
    old = (sampler + rng.normal(0.0, 0.4, size=(b, t))).astype(np.float32)
    lengths = rng.integers(0, t + 1, size=b)
    lengths[0] = t
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    # finite garbage at padding: the transcriptions multiply it by the mask, we never read it
    old = np.where(mask > 0, old, rng.normal(0, 30, size=(b, t))).astype(np.float32)
    w, keep = jax.jit(functools.partial(rc.rollout_correction, mode, **kwargs))(old, sampler, mask)
    ref_w, ref_mask = reference(old.astype(np.float64), sampler.astype(np.float64), mask.astype(np.float64))
    real = mask > 0
    np.testing.assert_allclose(np.asarray(w)[real], np.asarray(ref_w)[real], **close(rtol=1e-6, atol=1e-6))
    if mode in rc.DROPS_FROM_DENOMINATOR:
        # rejection rewrites the response mask: the kept tokens are exactly verl's modified mask
        np.testing.assert_array_equal(np.asarray(keep), np.asarray(ref_mask) > 0)
    else:
        # the weights carry the correction, the mask (the denominator) is unchanged; keep marks w's support
        np.testing.assert_array_equal(np.asarray(ref_mask) > 0, real)
        if mode in ("icepop", "seq_mask"):
            np.testing.assert_array_equal(np.asarray(keep), real & (np.asarray(ref_w) > 0))
        else:
            np.testing.assert_array_equal(np.asarray(keep), real)
    # the random draw exercises both sides of every threshold
    dropped = real & ~np.asarray(keep)
    if mode in rc.TRUNCATING:
        assert 0 < (np.asarray(w)[real] >= kwargs["cap"]).sum() < real.sum()
    else:
        assert 0 < dropped.sum() < real.sum(), (mode, dropped.sum())


# -- the settings group and what a run uses --------------------------------------------------------------


from rl_core.config import ConfigError
from rl_core.correction_config import PRESETS, RolloutCorrection, resolve_correction


def test_presets_modes_and_defaults():
    assert RolloutCorrection().mode == "token_tis" and RolloutCorrection().on  # the default (C = 2)
    assert not RolloutCorrection(mode="off").on and not RolloutCorrection(preset="off").on
    seq = RolloutCorrection(preset="seq_mask")  # TRL's default: sequence-level mask at C = 3
    assert (seq.mode, seq.cap, seq.lower) == ("seq_mask", 3.0, None)
    assert (RolloutCorrection(preset="token_tis").mode, RolloutCorrection(preset="token_tis").cap) == ("token_tis", 2.0)
    ice = RolloutCorrection(mode="icepop")
    assert (ice.cap, ice.lower) == (5.0, 0.5)
    rej = RolloutCorrection(mode="token_reject", cap=1.5)  # verl: lower = 1 / upper
    assert rej.lower == approx(1 / 1.5)
    assert RolloutCorrection(preset="seq_mask", cap=2.0).cap == 2.0  # explicit settings override the preset
    assert RolloutCorrection(preset="seq_mask", mode="icepop").cap == 5.0  # another mode: its own defaults
    for name, preset in PRESETS.items():
        made = RolloutCorrection(preset=name)
        assert (made.mode, made.cap, made.lower) == (preset.mode, preset.cap, preset.lower), name
        assert RolloutCorrection.from_dict(made.to_dict()) == made


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(mode="tis"), r"RolloutCorrection.mode = 'tis': must be one of"),
    (dict(preset="trl"), r"RolloutCorrection.preset = 'trl': must be one of"),
    (dict(mode="off", cap=2.0), r"cap = 2.0: has no effect with mode off"),
    (dict(mode="token_tis", cap=0.5), r"cap = 0.5: must be >= 1"),
    (dict(mode="seq_is", lower=0.5), r"lower = 0.5: has no effect with mode seq_is"),
    (dict(mode="icepop", lower=1.5), r"lower = 1.5: must be in \[0, 1\]"),
    (dict(mode="seq_reject", cap=0.9), r"cap = 0.9: must be >= 1"),
])
def test_bad_settings_name_the_field(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        RolloutCorrection(**kwargs)


def test_the_default_is_token_tis_and_off_means_off_sync_and_async():
    from algo_grpo import GRPOConfig
    from rl_core.train.behaviour import LogprobPasses

    assert (RolloutCorrection().mode, RolloutCorrection().cap) == ("token_tis", 2.0)
    default, off = GRPOConfig(), GRPOConfig(rollout_correction=RolloutCorrection(mode="off"))
    assert resolve_correction(default) == RolloutCorrection(preset="token_tis")
    for mode in ("off", "one_step"):  # an explicit off holds for async rollouts too
        assert not LogprobPasses.of(off, num_mini_batches=1, async_rollout=mode).behaviour
        assert not LogprobPasses.of(default, num_mini_batches=1, async_rollout=mode).behaviour
    assert not resolve_correction(off).on and resolve_correction(default).on
    # tis_cap, the old name of token_tis with that cap, becomes the group when it is left at its default
    assert (GRPOConfig(tis_cap=3.0).rollout_correction.mode, GRPOConfig(tis_cap=3.0).rollout_correction.cap) == (
        "token_tis", 3.0)
    # a config written before the default changed (its group resolved to off) keeps no correction
    saved = GRPOConfig.from_dict({"rollout_correction": {"preset": None, "mode": "off", "cap": None, "lower": None}})
    assert not resolve_correction(saved).on
    # an explicit group is kept
    assert resolve_correction(GRPOConfig(rollout_correction=RolloutCorrection(mode="icepop"))).mode == "icepop"


# -- composed in the objective: weights times the policy loss, the keep-mask, the aggregation -----------


def _compose(mode_kwargs, *, proximal=False, moved=0.0):
    from rl_core import registry
    from rl_core.train.correction import correct_policy_terms

    old, sampler, mask = _inputs(RATIOS, MASK)
    old = jnp.nan_to_num(old)
    logp = old + moved * mask
    pg = -jnp.ones((2, 3))  # A = 1 on every token, ratio 1: the policy term is -1 per token
    correction = RolloutCorrection(**mode_kwargs)
    pg, loss_mask, means, maxima = correct_policy_terms(pg, logp, old, jnp.nan_to_num(sampler), mask,
                                                         correction=correction, proximal=proximal)
    total, denom = registry.get("loss_aggregation", "token-mean")(pg, loss_mask, max_len=3)
    metrics = {k: float(s) / float(c) for k, (s, c) in means.items()}
    return float(total) / float(denom), float(denom), metrics, {k: float(v) for k, v in maxima.items()}


def test_composed_losses_by_hand():
    # token_tis C = 2: -(1.5 + 2 + 0.4 + 0.9 + 1.2) / 5 = -1.2
    assert _compose(dict(mode="token_tis", cap=2.0))[:2] == approx((-1.2, 5.0))
    # token_reject [1/2, 2]: 3 and 0.4 rejected from numerator and denominator: -3 / 3
    assert _compose(dict(mode="token_reject", cap=2.0))[:2] == approx((-1.0, 3.0))
    # seq_reject [1/1.5, 1.5]: row 0 (1.8) rejected whole: -2 / 2
    assert _compose(dict(mode="seq_reject", cap=1.5))[:2] == approx((-1.0, 2.0))
    # icepop [0.5, 2]: weights 1.5, 0, 0, 0.9, 1.2; the denominator keeps all 5: -3.6 / 5
    assert _compose(dict(mode="icepop", lower=0.5, cap=2.0))[:2] == approx((-0.72, 5.0))
    # seq_mask C = 1.5: row 0 (1.8) weight 0, row 1 1.08 on 2 tokens: -2.16 / 5
    assert _compose(dict(mode="seq_mask", cap=1.5))[:2] == approx((-0.432, 5.0))
    # off: -5 / 5
    assert _compose(dict(mode="off"))[:2] == approx((-1.0, 5.0))
    # the default group: token_tis at C = 2, as above
    assert _compose(dict())[:2] == approx((-1.2, 5.0))


def test_mismatch_and_staleness_metrics_by_hand():
    logs = np.abs(np.log([1.5, 3.0, 0.4, 0.9, 1.2]))
    _, _, m, mx = _compose(dict(mode="token_reject", cap=2.0), moved=0.1)
    assert m["rollout/mismatch_logp_abs_mean"] == approx(logs.mean(), rel=1e-5)
    assert m["drift/logp_abs_mean"] == approx(logs.mean(), rel=1e-5)
    # per sequence: row 0 mean of 3, row 1 mean of 2, then their mean
    assert m["rollout/mismatch_seq_logp_abs_mean"] == approx((logs[:3].mean() + logs[3:].mean()) / 2, rel=1e-5)
    assert mx["rollout/mismatch_logp_abs_max"] == approx(np.log(3.0), rel=1e-5)
    # the current policy moved 0.1 per token away from the behaviour one
    assert m["rollout/staleness_logp_abs_mean"] == approx(0.1, rel=1e-5)
    assert m["rollout/masked_frac"] == approx(0.4) and m["rollout/seq_masked_frac"] == approx(0.5)
    assert m["rollout/corrected_frac"] == 0.0
    # async: old_logp is the proximal policy's, so the same gap is not called mismatch
    _, _, m, mx = _compose(dict(mode="token_tis", cap=2.0), proximal=True)
    assert "rollout/mismatch_logp_abs_mean" not in m
    assert m["rollout/offpolicy_logp_abs_mean"] == approx(logs.mean(), rel=1e-5)
    assert m["drift/tis_weight_mean"] == approx(1.2) and m["drift/tis_capped_frac"] == approx(0.2)
    assert m["rollout/corrected_frac"] == approx(0.2) and m["rollout/staleness_logp_abs_mean"] == 0.0


# -- on every algorithm's config and learner ------------------------------------------------------------


def test_the_group_on_the_shared_config_round_trips_and_keeps_tis_cap():
    from algo_dapo import DAPOConfig
    from algo_grpo import GRPOConfig

    grpo = GRPOConfig.from_dict({"rollout_correction": {"preset": "seq_mask"}})
    assert (grpo.rollout_correction.mode, grpo.rollout_correction.cap) == ("seq_mask", 3.0)
    assert GRPOConfig.from_dict(grpo.to_dict()) == grpo
    dapo = DAPOConfig.from_dict({"rollout_correction": {"mode": "geo_reject", "cap": 1.01}})
    assert dapo.rollout_correction.lower == approx(1 / 1.01) and DAPOConfig.from_dict(dapo.to_dict()) == dapo
    # an old config (tis_cap only) still loads, and means token_tis with that cap
    old = GRPOConfig.from_dict({"tis_cap": 2.5})
    assert old.rollout_correction == RolloutCorrection.token_tis(2.5) and GRPOConfig.from_dict(old.to_dict()) == old
    assert (resolve_correction(old).mode, resolve_correction(old).cap) == ("token_tis", 2.5)
    assert GRPOConfig(tis_cap=2.0, rollout_correction=RolloutCorrection(mode="token_tis", cap=2.0)).tis_cap == 2.0
    with pytest.raises(ConfigError, match=r"tis_cap = 2.0 and rollout_correction \(mode='icepop'"):
        GRPOConfig(tis_cap=2.0, rollout_correction=RolloutCorrection(mode="icepop"))
    with pytest.raises(ConfigError, match="RolloutCorrection has no field 'capp'"):
        GRPOConfig.from_dict({"rollout_correction": {"capp": 2.0}})


def test_a_correction_adds_no_behaviour_pass_to_an_on_policy_step():
    """On a provably on-policy step the loss's stop_gradient(logp) is the behaviour policy's (with
    async rollouts the proximal policy's) in value, so a correction divides it by the sampler's
    log-probs without a pass of its own; several mini-batches need the pass, correction or not."""
    from algo_grpo import GRPOConfig
    from rl_core.train.behaviour import LogprobPasses

    def passes(config, mode="off", mini_batches=1):
        return LogprobPasses.of(config, num_mini_batches=mini_batches, async_rollout=mode)

    seq_mask = GRPOConfig(rollout_correction=RolloutCorrection(preset="seq_mask"))
    assert not passes(GRPOConfig()).behaviour
    assert resolve_correction(seq_mask).on and not passes(seq_mask).behaviour
    assert resolve_correction(GRPOConfig(tis_cap=2.0)).on and not passes(GRPOConfig(tis_cap=2.0)).behaviour
    assert resolve_correction(GRPOConfig()).on  # the default, synchronous or async
    assert not passes(GRPOConfig(), "one_step").behaviour
    assert passes(seq_mask, mini_batches=2).behaviour and passes(GRPOConfig(), "one_step", 2).behaviour


MODE_CASES = [
    dict(mode="token_tis", cap=2.0),
    dict(mode="seq_is", cap=2.0),
    dict(mode="token_reject", cap=2.5, lower=0.6),
    dict(mode="seq_reject", cap=4.0, lower=0.6),
    dict(mode="geo_reject", cap=1.4, lower=0.9),
    dict(mode="icepop", cap=2.5, lower=0.6),
    dict(mode="seq_mask", cap=2.0),
]


# a learner per mode: the default (token_tis) and one masking mode in the fast tier, the rest in
# e2e (every mode's formula is checked by hand above, in the fast tier)
@pytest.mark.parametrize("settings", [c if c["mode"] in ("token_tis", "icepop") else pytest.param(c, marks=pytest.mark.e2e)
                                      for c in MODE_CASES], ids=[c["mode"] for c in MODE_CASES])
def test_a_learner_with_a_mismatched_sampler_applies_each_mode(settings):
    """Every mode through the GRPO learner (the shared objective): its sampler under-rates the
    tokens by factors 0.5, 1.5, 3 (so rho ~ those), and the logged policy loss and fractions are
    the ones of the weights and masks recomputed here from the example."""
    import rewards
    import rl_models
    from algo_grpo import GRPOConfig

    from rl_core.testing import MismatchedSampler

    correction = RolloutCorrection(**settings)
    learner = MismatchedSampler.on_doubling(
        GRPOConfig(group_size=2, beta=0.0, rollout_correction=correction), tokenizer=rl_models.CharTokenizer(),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward()]))
    assert resolve_correction(learner._config).on and not learner._passes.behaviour  # on-policy: sg(logp) is old_logp
    metrics = learner.train_step()
    example = learner.last_example
    mask = np.asarray(example.completion_mask)
    old, sampler = learner.last_old_logp, np.asarray(example.sampler_logp)
    w, keep = rc.rollout_correction(correction.mode, old, sampler, mask, cap=correction.cap, lower=correction.lower)
    w, keep = np.asarray(w), np.asarray(keep)
    real = mask > 0
    assert metrics["rollout/masked_frac"] == approx((real & ~keep).sum() / real.sum(), abs=1e-6)
    assert metrics["rollout/weight_mean"] == approx(w[real].mean(), rel=1e-4)
    assert metrics["rollout/mismatch_logp_abs_mean"] == approx(np.abs(old - sampler)[real].mean(), rel=1e-4)
    # rho = 1 (one pass): GRPO's token term is -A * w on kept tokens; seq-mean-token-mean over the loss mask
    loss_mask = mask * keep if correction.mode in rc.DROPS_FROM_DENOMINATOR else mask
    adv = np.asarray(example.advantages)[:, None]
    rows = loss_mask.sum(axis=1) > 0
    per_row = (-adv * w * keep * loss_mask).sum(axis=1)[rows] / loss_mask.sum(axis=1)[rows]
    assert metrics["train/policy_loss"] == approx(per_row.mean() if rows.any() else 0.0, rel=1e-4, abs=1e-6)
    if correction.mode not in rc.TRUNCATING:
        assert 0 < metrics["rollout/masked_frac"] < 1  # the factors straddle the thresholds


def test_bfloat16_rollout_weights_are_a_mismatch_the_metrics_and_the_correction_see():
    """rollout.weights_dtype = bfloat16: the engine samples with a bfloat16 copy of the weights, so
    its log-probs leave the float32 trainer's by the rounding of every weight (a float32 engine
    agrees to ~1e-6), the same-weights mismatch metrics show it, and token TIS weighs by it."""
    import rewards
    import rl_models
    from algo_grpo import GRPOConfig, GRPOLearner
    from flax import nnx
    from rl_core.config import RolloutConfig, TrainingConfig
    from rl_core.data import Prompt

    tok = rl_models.CharTokenizer()
    model = rl_models.TransformerConfig.tiny(tok.vocab_size, hidden_size=32, num_layers=1, num_heads=2,
                                             num_kv_heads=1, mlp_hidden_size=64)

    def step(weights_dtype):
        learner = GRPOLearner(
            GRPOConfig(group_size=4, beta=0.0, rollout_correction=RolloutCorrection(preset="token_tis")),
            policy=rl_models.Transformer(model, rngs=nnx.Rngs(0)), tokenizer=tok,
            train_data=[Prompt(f"{a}+{a}=", {"answer": str(2 * a)}) for a in range(1, 5)],
            training=TrainingConfig(prompts_per_step=2),
            rollout=RolloutConfig(max_new_tokens=4, max_prompt_tokens=8, weights_dtype=weights_dtype),
            reward_manager=rewards.RewardManager([rewards.numeric_answer_reward()]),
        )  # fmt: skip
        metrics = learner.train_step()
        held = {x.dtype for x in jax.tree.leaves(learner.generator.backend._params)}
        return metrics, held

    f32, f32_held = step(None)
    bf16, bf16_held = step("bfloat16")
    assert f32_held == {jnp.dtype(jnp.float32)} and bf16_held == {jnp.dtype(jnp.bfloat16)}
    assert f32["rollout/mismatch_logp_abs_max"] < bound(1e-5)  # two programs: the sampler's, the learner's
    assert bf16["rollout/mismatch_logp_abs_max"] > 1e-3 and bf16["rollout/mismatch_logp_abs_mean"] > 1e-4
    assert f32["drift/tis_weight_mean"] == approx(1.0, abs=1e-5)
    assert bf16["drift/tis_weight_mean"] != approx(1.0, abs=1e-5)  # the weights follow the gap


def test_bfloat16_rollout_weights_leave_integer_and_narrow_leaves_alone():
    """A quantized base's integer codes and leaves already in bfloat16 reach the engine as they are."""
    from rl_core.rollout.weights import cast_weights

    tree = {"w": jnp.full((2, 2), 1.0 + 2.0**-10, jnp.float32), "codes": jnp.arange(4, dtype=jnp.int8),
            "scale": jnp.ones((2,), jnp.bfloat16)}
    out = cast_weights(tree, "bfloat16")
    assert {k: v.dtype for k, v in out.items()} == {"w": jnp.bfloat16, "codes": jnp.int8, "scale": jnp.bfloat16}
    assert float(out["w"][0, 0]) == 1.0  # rounded to bfloat16's 8 bits of mantissa
    np.testing.assert_array_equal(out["codes"], tree["codes"])
