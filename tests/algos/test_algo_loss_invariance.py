"""The loss-invariance contract: how a batch is cut and laid out never changes the loss or its gradient.

Each policy loss returns (sum, denominator) pairs per micro-batch, summed before the one
division (rl_core.math.aggregation, rl_core.train.trainable.summed_grads), so the loss and the
gradient are the same, to float32 rounding, whatever the micro-batch size, and whether the
update packs its rows or runs each group's prompt once. Here:

- every registered policy loss x every registered aggregation (with the KL term), every
  rollout-correction mode, every KL estimator and distillation: the loss of the whole batch and
  its gradient with respect to the log-probs equal the sums over micro-batches of 1, 2 and 4
  rows (the fast tier: every loss x aggregation, in micro-batches of 1 row);
- the one setting that is per micro-batch by definition, `entropy_top_fraction` < 1 (the
  entropy threshold is the micro-batch's quantile, as TRL takes it over the batch it sees): the
  split loss is exactly the loss of the per-micro-batch selection, not the whole batch's;
- fast tier: GRPO's own learner update (its KL term on, a small policy) packed, and sharing
  prompts, over micro-batches equals the plain one-micro-batch update.

test_algo_loss_invariance_mesh.py runs the model half in full on the tiny transformer: every
installed algorithm's own config through its learner's update, on one device and on meshes of
8 simulated devices. Every list comes from the registry: a new loss, aggregation or algorithm
package is covered without editing a file.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core import registry
from rl_core.correction_config import RolloutCorrection
from rl_core.math.rollout_correction import MODES
from rl_core.train.objective import high_entropy_mask, policy_gradient_loss

import invariance_contract as contract
from rl_core.testing import BagPolicy
from tolerances import bound, close

registry.registry.names("algorithm")  # loads every algorithm package: their losses register too
# each registered function once (GRPO's clipped surrogate is registered under two names)
POLICY_LOSSES = sorted({registry.get("policy_loss", name): name
                        for name in reversed(registry.registry.names("policy_loss"))}.values())
AGGREGATIONS = registry.registry.names("loss_aggregation")
KL_ESTIMATORS = registry.registry.names("kl_estimator")
MICRO_SIZES = (1, 2, 4)  # rows per micro-batch, of the example's 8
TOL = 1e-5  # float32, a sum of a few dozen terms (STYLE: 1e-5 simple, 1e-4 composite)

EXAMPLE = contract.example()
# two tokens the sampler rated far off (rho = pi_old / pi_sampler = e^1.2 = 3.3 and e^-1 = 0.37, both
# outside [0.5, 2]), so that the correction modes truncate, reject and drop from the denominator
_SPIKES = np.zeros_like(EXAMPLE.sampler_logp)
_SPIKES[0, 1], _SPIKES[5, 0] = -1.2, 1.0
EXAMPLE = EXAMPLE._replace(sampler_logp=EXAMPLE.sampler_logp + _SPIKES)
# the current policy's log-probs: the old policy's moved by a fixed pattern, so that ratios
# spread over both sides of the clip range; entropies likewise fixed
LOGP = jnp.asarray(EXAMPLE.old_logp + contract.wave(EXAMPLE.old_logp.shape, 0.35, 5.0))
ENTROPY = jnp.asarray(2.0 + contract.wave(LOGP.shape, 1.0, 6.0))


CLIP = {"eps_low": 0.2, "eps_high": 0.28, "dual_clip": None}


def settings(*, policy_loss="grpo", aggregation="token-mean", kl="k3", beta=0.04, correction="off", **more):
    """policy_gradient_loss's settings, the registered functions looked up by name."""
    # geo_reject's default band, a geometric-mean ratio within 0.1% of 1, would keep no sequence here
    rc = RolloutCorrection(mode=correction, cap=1.1 if correction == "geo_reject" else None)
    return {
        "policy_loss": registry.get("policy_loss", policy_loss),
        "aggregate": registry.get("loss_aggregation", aggregation),
        "kl_estimator": registry.get("kl_estimator", kl),
        "beta": beta,
        **CLIP,
        "max_len": contract.T,
        "rollout_correction": rc,
        **more,
    }


def loss_and_grad(kwargs, micro: int):
    """(total / denominator, its gradient in the log-probs [B, T]) with the batch's rows summed
    over micro-batches of `micro` rows, as the update sums them (traced)."""
    example = jax.tree.map(jnp.asarray, EXAMPLE)
    b = LOGP.shape[0]

    def split(x):
        return x.reshape(b // micro, micro, *x.shape[1:])

    def loss(logp):
        total, denom = jax.vmap(lambda lp, ent, ex: policy_gradient_loss(lp, ent, ex, **kwargs)[:2])(
            split(logp), split(ENTROPY), jax.tree.map(split, example))
        return jnp.sum(total) / jax.lax.stop_gradient(jnp.sum(denom))

    return jax.value_and_grad(loss)(LOGP)


def sweep(cases: dict, micro_sizes=(8, *MICRO_SIZES)) -> dict:
    """label -> micro-batch size -> (loss, gradient) for each case of policy_gradient_loss settings,
    all in one jitted program (one compile for many cases)."""
    program = jax.jit(lambda: {label: {m: loss_and_grad(kwargs, m) for m in micro_sizes}
                               for label, kwargs in cases.items()})
    return jax.device_get(program())


def assert_invariant(results: dict) -> None:
    """Every case's loss and gradient at each micro-batch size equal the whole batch's (8 rows)."""
    for label, by_size in results.items():
        whole, whole_grad = by_size[8]
        assert abs(float(whole)) > 1e-3 and np.max(np.abs(whole_grad)) > 1e-3, label  # a real loss is compared
        for micro, (loss, grad) in by_size.items():
            np.testing.assert_allclose(loss, whole, **close(rtol=TOL, atol=TOL),
                                       err_msg=f"{label}: loss, micro-batches of {micro}")
            np.testing.assert_allclose(grad, whole_grad, **close(rtol=TOL, atol=TOL),
                                       err_msg=f"{label}: gradient, micro-batches of {micro}")


# -- the pure half: policy_gradient_loss on fixed log-probs -----------------------------------

FULL_SWEEP = pytest.mark.e2e
"""The full sweep is a wider matrix: it runs in the e2e tier (it needs no devices; the mesh half
is in the multidevice tier); the fast tier checks every loss under every aggregation with one
split (micro-batches of 1 row)."""


@pytest.mark.parametrize("policy_loss", POLICY_LOSSES)
def test_every_loss_under_every_aggregation_is_the_same_in_single_row_micro_batches(policy_loss):
    assert_invariant(sweep({agg: settings(policy_loss=policy_loss, aggregation=agg) for agg in AGGREGATIONS},
                           micro_sizes=(8, 1)))


@FULL_SWEEP
@pytest.mark.parametrize("policy_loss", POLICY_LOSSES)
def test_every_loss_under_every_aggregation_is_the_same_over_micro_batches(policy_loss):
    assert_invariant(sweep({agg: settings(policy_loss=policy_loss, aggregation=agg) for agg in AGGREGATIONS}))


@FULL_SWEEP
@pytest.mark.parametrize("mode", [m for m in MODES if m != "off"])
def test_every_rollout_correction_is_the_same_over_micro_batches(mode):
    """Weights, keep-masks and the rejection modes' smaller denominators are all per row."""
    assert_invariant(sweep({agg: settings(aggregation=agg, correction=mode) for agg in AGGREGATIONS}))


@FULL_SWEEP
def test_every_kl_estimator_and_distillation_are_the_same_over_micro_batches():
    assert_invariant(sweep({kl: settings(kl=kl, aggregation="seq-mean-token-mean", distill_coef=0.5)
                            for kl in KL_ESTIMATORS}))


@FULL_SWEEP
def test_high_entropy_selection_is_per_micro_batch_by_definition():
    """entropy_top_fraction = 0.5 keeps the tokens at or above the median entropy *of the
    micro-batch* (the loss never sees the others). Split, the loss is exactly that selection
    aggregated over the whole batch; it is not the whole batch's selection."""
    kwargs = settings(beta=0.0, entropy_top_fraction=0.5)
    mask = jnp.asarray(EXAMPLE.completion_mask)
    sizes = (8, *MICRO_SIZES)

    @jax.jit
    def per_micro_batch_selection():
        pg, _ = registry.get("policy_loss", "grpo")(LOGP, jnp.asarray(EXAMPLE.old_logp),
                                                    jnp.asarray(EXAMPLE.advantages), mask, **CLIP)
        out = {}
        for micro in sizes:
            kept = jnp.concatenate([high_entropy_mask(ENTROPY[i:i + micro], mask[i:i + micro], 0.5)
                                    for i in range(0, 8, micro)])
            total, denom = registry.get("loss_aggregation", "token-mean")(jnp.where(kept, pg, 0.0), mask,
                                                                          max_len=contract.T)
            out[micro] = total / denom
        return out

    expected = jax.device_get(per_micro_batch_selection())
    got = sweep({"top-half": kwargs}, sizes)["top-half"]
    for micro in MICRO_SIZES:
        np.testing.assert_allclose(got[micro][0], expected[micro], **close(rtol=TOL, atol=TOL))
        assert abs(float(got[micro][0]) - float(got[8][0])) > 1e-3  # another selection: not the whole batch's


# -- the model half, in small: GRPO's own learner update under packing, shared prompts and accumulation -----


def bag_policy(seed: int) -> BagPolicy:
    """A policy that compiles several times faster than a transformer (rl_core.testing)."""
    return BagPolicy(contract.TOK.vocab_size, rngs=nnx.Rngs(seed))


@pytest.fixture(scope="module")
def grpo_updates():
    """layout name -> (one update's results, the layout used) of GRPO's learner (its KL term on)."""
    algorithm = registry.get_algorithm("grpo")
    config = dataclasses.replace(algorithm.config(), group_size=contract.G)
    assert config.beta > 0
    out = {"reference": contract.one_update(algorithm, config, {}, make_policy=bag_policy)}
    for name in ("packed-micro-2", "shared-micro-4"):
        _, training = contract.LAYOUTS[name]
        out[name] = contract.one_update(algorithm, config, training, make_policy=bag_policy)
    return out


@pytest.mark.parametrize("name", ["packed-micro-2", "shared-micro-4"])
def test_grpo_update_is_the_same_packed_or_sharing_prompts_over_micro_batches(grpo_updates, name):
    got, layout = grpo_updates[name]
    # the layout really is in effect: 4 micro-batches packed, or 2 each running its group's prompt once
    assert layout == {"packed-micro-2": {"micro_batches": 4, "packing": True, "rows_per_prompt": 1, "devices": 1},
                      "shared-micro-4": {"micro_batches": 2, "packing": False, "rows_per_prompt": 4,
                                         "devices": 1}}[name]
    diffs = contract.max_diffs(got, grpo_updates["reference"][0])["policy"]
    assert abs(diffs["ref_loss"]) > 1e-2 and diffs["ref_grad_max"] > 1e-2  # a real update is compared
    most = bound(TOL)  # the CPU's TOL; a TPU's float32 floor there
    assert diffs["loss"] <= most and diffs["grad"] <= most and diffs["grad_norm"] <= most, diffs
