"""High-entropy token selection (`algorithm.entropy_top_fraction`, "Beyond the 80/20 Rule",
arXiv:2506.01939; TRL's top_entropy_quantile): the policy-gradient term only on the
micro-batch's highest-entropy tokens, the denominator and the KL term on every real token."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from algo_grpo import GRPOConfig
from rl_core import registry
from rl_core.config import ConfigError, RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.testing import tree_max_abs_diff
from rl_core.train.objective import high_entropy_mask, policy_gradient_loss
from rl_core.types import TrainExample
from rl_core.testing import train_counting_compiles
from tolerances import approx, close

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])

# Two completions of 4 positions; 3 + 3 real tokens. The pad (row 1, last) has the largest entropy.
MASK = jnp.asarray([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
ENTROPY = jnp.asarray([[0.5, 2.0, 0.1, 9.0], [1.5, 0.3, 3.0, 9.0]])
ADV = jnp.asarray([1.0, -2.0])
LOGP = jnp.asarray([[-1.0, -0.5, -2.0, -3.0], [-0.7, -1.2, -0.4, -2.0]])
REF = LOGP - 0.3


def loss(logp, *, fraction=None, agg="token-mean", beta=0.0, adv=ADV):
    example = TrainExample(
        prompt_tokens=jnp.zeros((2, 1), jnp.int32), prompt_mask=jnp.ones((2, 1)),
        completion_tokens=jnp.zeros((2, 4), jnp.int32), completion_mask=MASK, advantages=adv,
        ref_logp=REF if beta else None,
    )  # fmt: skip
    extra = {} if fraction is None else {"entropy_top_fraction": fraction}
    out = policy_gradient_loss(
        logp, ENTROPY, example, policy_loss=registry.get("policy_loss", "grpo"),
        aggregate=registry.get("loss_aggregation", agg),
        kl_estimator=registry.get("kl_estimator", "k3") if beta else None, beta=beta,
        eps_low=0.2, eps_high=0.2, dual_clip=None, max_len=4, **extra,
    )  # fmt: skip
    return out.total / out.denom, out


@VARIANTS
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_fraction_one_is_the_unselected_loss_exactly(variant, agg):
    f = lambda lp, fr: jax.value_and_grad(lambda x: loss(x, fraction=fr, agg=agg)[0])(lp)  # noqa: E731
    (v0, g0), (v1, g1) = variant(lambda lp: f(lp, None))(LOGP), variant(lambda lp: f(lp, 1.0))(LOGP)
    assert np.array_equal(np.asarray(v0), np.asarray(v1)) and np.array_equal(np.asarray(g0), np.asarray(g1))
    # the mask at fraction 1 would keep every real token anyway (threshold = the smallest entropy)
    assert np.array_equal(np.asarray(high_entropy_mask(ENTROPY, MASK, 1.0)), np.asarray(MASK > 0))


@VARIANTS
def test_half_keeps_exactly_the_high_entropy_tokens(variant):
    # Real entropies sorted: 0.1 0.3 0.5 1.5 2.0 3.0; the 0.5-quantile is 1.0 (between 0.5 and 1.5):
    # kept are 2.0 (row 0), 1.5 and 3.0 (row 1); the pad's 9.0 never is.
    kept = np.asarray(high_entropy_mask(ENTROPY, MASK, 0.5))
    assert kept.tolist() == [[False, True, False, False], [True, False, True, False]]
    (value, out), grad = variant(jax.value_and_grad(lambda lp: loss(lp, fraction=0.5), has_aux=True))(LOGP)
    # on-policy ratio 1: the surrogate is -A per kept token; token-mean over all 6 real tokens
    np.testing.assert_allclose(value, -(1.0 + 2 * -2.0) / 6, **close(atol=1e-6))
    np.testing.assert_allclose(grad, [[0, -1 / 6, 0, 0], [2 / 6, 0, 2 / 6, 0]], **close(atol=1e-6))
    assert float(out.denom) == 6.0  # every real token, selected or not
    total, count = out.means["train/entropy_kept_frac"]
    assert float(total / count) == approx(0.5)


def test_ties_at_the_threshold_are_kept_and_the_quantile_interpolates():
    mask = jnp.ones((1, 5))
    # 5 tokens, fraction 0.5: the threshold is the 0.5-quantile = the middle value 2.0, kept with both ties
    ent = jnp.asarray([[2.0, 1.0, 2.0, 3.0, 0.5]])
    assert np.asarray(high_entropy_mask(ent, mask, 0.5)).tolist() == [[True, False, True, True, False]]
    # fraction 0.2 of 5: the 0.8-quantile, 0.2 of the way from 2.0 to 3.0 = 2.2: only the 3.0
    assert np.asarray(high_entropy_mask(ent, mask, 0.2)).tolist() == [[False, False, False, True, False]]
    # no real token: nothing is selected (and nothing is NaN)
    assert not np.asarray(high_entropy_mask(ent, jnp.zeros((1, 5)), 0.5)).any()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.8])
def test_threshold_is_numpys_linear_quantile_of_the_real_tokens(seed, fraction):
    rng = np.random.default_rng(seed)
    ent = rng.random((6, 9)).astype(np.float32)
    mask = (rng.random((6, 9)) > 0.3).astype(np.float32)
    expected = (ent >= np.quantile(ent[mask > 0], 1 - fraction)) & (mask > 0)  # TRL's rule (torch.quantile)
    assert np.array_equal(np.asarray(high_entropy_mask(jnp.asarray(ent), jnp.asarray(mask), fraction)), expected)


def test_the_kl_term_stays_on_every_token():
    grad = jax.grad(lambda lp: loss(lp, fraction=0.5, beta=0.1)[0])(LOGP)
    kl_only = jax.grad(lambda lp: loss(lp, fraction=0.5, beta=0.1, adv=jnp.zeros(2))[0])(LOGP)
    dropped = ~np.asarray(high_entropy_mask(ENTROPY, MASK, 0.5)) & np.asarray(MASK > 0)
    assert np.all(np.asarray(kl_only)[dropped] != 0)
    np.testing.assert_array_equal(np.asarray(grad)[dropped], np.asarray(kl_only)[dropped])


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_config_rejects_fractions_outside_zero_one(bad):
    with pytest.raises(ConfigError, match="entropy_top_fraction"):
        GRPOConfig(entropy_top_fraction=bad)


def test_config_takes_it_from_a_dict():
    assert GRPOConfig.from_dict({"entropy_top_fraction": "0.2"}).entropy_top_fraction == 0.2
    assert GRPOConfig().entropy_top_fraction == 1.0


def digit_fraction(prompts, completions, **_):
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


# a learner each: one micro-batch in the fast tier, four in e2e
@pytest.mark.parametrize("micro_batch_size", [None, pytest.param(4, marks=pytest.mark.e2e)])
def test_a_learner_trains_with_it_and_compiles_once(micro_batch_size):
    tok = rl_models.CharTokenizer()
    model = rl_models.TransformerConfig.tiny(
        tok.vocab_size, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, mlp_hidden_size=64
    )
    algorithm = registry.get_algorithm("grpo")
    learner = algorithm.learner(
        dataclasses.replace(algorithm.config(), group_size=4, entropy_top_fraction=0.5),
        policy=rl_models.Transformer(model, rngs=nnx.Rngs(0)),
        tokenizer=tok,
        train_data=[Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 10) for b in range(1, 10)],
        training=TrainingConfig(prompts_per_step=2, num_steps=3, learning_rate=1e-3, micro_batch_size=micro_batch_size),
        rollout=RolloutConfig(max_new_tokens=4, max_prompt_tokens=8),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), digit_fraction]),
    )
    before = jax.tree.map(np.array, learner.params)
    history, new = train_counting_compiles(learner)
    assert all(math.isfinite(m["train/loss"]) and m["train/skipped_updates"] == 0 for m in history)
    # about half the real tokens (ties at the threshold are kept)
    kept = [m["train/entropy_kept_frac"] for m in history]
    assert all(0.4 <= k <= 0.75 for k in kept), kept
    assert tree_max_abs_diff(before, jax.tree.map(np.array, learner.params)) > 0
    assert new == [0, 0]
