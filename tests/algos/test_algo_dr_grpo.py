"""Dr. GRPO: its advantage on written-out rewards, its relation to GRPO's, and
that the package stays a dozen lines declared by an entry point only."""

import importlib.metadata
import math
import re
import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from algo_dr_grpo import DrGRPOConfig, DrGRPOLearner, dr_grpo_advantages
from algo_grpo import GRPOConfig, GRPOLearner
from rl_core import registry
from rl_core.math.advantages import grpo_advantages
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.testing import BagPolicy, make_groups
from code_lines import code_lines as _code_lines
from tolerances import close

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "packages" / "algo-dr-grpo"

VARIANTS = pytest.mark.parametrize("variant", [lambda f: f, jax.jit], ids=["eager", "jit"])


def _dr(variant, rewards_, group_size):
    return np.asarray(variant(lambda r: dr_grpo_advantages(r, group_size))(jnp.asarray(rewards_, jnp.float32)))


# -- the estimator ------------------------------------------------------------------------


def test_dr_grpo_is_the_registered_estimator():
    assert registry.get("advantage_estimator", "dr_grpo") is dr_grpo_advantages
    assert registry.registry.provider("advantage_estimator", "dr_grpo") == "algo-dr-grpo"


@VARIANTS
def test_one_group_of_four(variant):
    # [1, 0, 0, 1]: mean 0.5, so A = r - 0.5 = [0.5, -0.5, -0.5, 0.5] (no division by std).
    np.testing.assert_allclose(_dr(variant, [1, 0, 0, 1], 4), [0.5, -0.5, -0.5, 0.5], **close(atol=1e-6))


@VARIANTS
def test_groups_of_two_are_independent(variant):
    # G = 2. [3, 1]: mean 2 -> [1, -1]. [2, 2]: uniform -> [0, 0]. [0, 5]: mean 2.5 -> [-2.5, 2.5].
    adv = _dr(variant, [3, 1, 2, 2, 0, 5], 2)
    np.testing.assert_allclose(adv, [1.0, -1.0, 0.0, 0.0, -2.5, 2.5], **close(atol=1e-6))


@VARIANTS
@pytest.mark.parametrize("uniform", [[0, 0, 0, 0], [1, 1, 1, 1], [0.1, 0.1, 0.1, 0.1]], ids=["zeros", "ones", "tenths"])
def test_uniform_group_is_exactly_zero(variant, uniform):
    # A float mean of [0.1]*4 can differ from 0.1 by a rounding step; the estimator
    # must still return exact zeros (no gradient from a group without signal).
    adv = _dr(variant, uniform, 4)
    assert np.array_equal(adv, np.zeros(4, np.float32))


@VARIANTS
def test_integer_rewards_are_not_truncated(variant):
    # int32 [1, 0, 0]: mean 1/3 -> [2/3, -1/3, -1/3]; an integer mean would give [1, 0, 0].
    adv = np.asarray(variant(lambda r: dr_grpo_advantages(r, 3))(jnp.asarray([1, 0, 0], jnp.int32)))
    np.testing.assert_allclose(adv, [2 / 3, -1 / 3, -1 / 3], **close(atol=1e-6))


def test_under_vmap():
    # Two independent reward vectors of one group each: [1, 0] -> [0.5, -0.5]; [4, 2] -> [1, -1].
    batch = jnp.asarray([[1.0, 0.0], [4.0, 2.0]])
    adv = jax.vmap(lambda r: dr_grpo_advantages(r, 2))(batch)
    np.testing.assert_allclose(adv, [[0.5, -0.5], [1.0, -1.0]], **close(atol=1e-6))


@VARIANTS
def test_relation_to_grpo(variant):
    # GRPO divides Dr. GRPO's centred rewards by (std(r, ddof=1) + 1e-6) per group.
    # [1, 0, 0, 1]: std = sqrt(1/3); [2, 0, 0, 0]: std = 1;
    # [0.5, 0.25, 1, 0]: mean 0.4375, squared deviations 0.00390625 + 0.03515625 + 0.31640625
    # + 0.19140625 = 0.546875, std = sqrt(0.546875 / 3); [3, 3, 3, 3]: uniform, both are 0.
    r = np.asarray([1, 0, 0, 1, 2, 0, 0, 0, 0.5, 0.25, 1, 0, 3, 3, 3, 3], np.float32)
    std = np.repeat([math.sqrt(1 / 3), 1.0, math.sqrt(0.546875 / 3), 0.0], 4)
    dr = _dr(variant, r, 4)
    grpo = np.asarray(variant(lambda x: grpo_advantages(x, 4))(jnp.asarray(r)))
    np.testing.assert_allclose(dr / (std + 1e-6), grpo, **close(atol=1e-5))
    assert np.array_equal(dr[12:], np.zeros(4)) and np.array_equal(grpo[12:], np.zeros(4))


def test_config_defaults_are_the_three_changes():
    cfg = DrGRPOConfig()
    assert (cfg.advantage_estimator, cfg.loss_agg_mode, cfg.beta) == ("dr_grpo", "seq-mean-token-sum-norm", 0.0)
    # everything else is GRPO's
    parent = GRPOConfig()
    for name in ("group_size", "kl_estimator", "epsilon_low", "epsilon_high", "policy_loss", "num_iterations"):
        assert getattr(cfg, name) == getattr(parent, name)
    assert issubclass(DrGRPOLearner, GRPOLearner)


# -- a NaN reward inside a group ----------------------------------------------------------


def _nan_on_bad(prompts, completions, **_):
    return [math.nan if c == "bad" else 1.0 for c in completions]


def test_nan_reward_inside_a_group_names_the_function():
    tok = rl_models.CharTokenizer()
    learner = GRPOLearner(
        GRPOConfig(group_size=2, beta=0.0),
        policy=BagPolicy(tok.vocab_size, rngs=nnx.Rngs(0)),
        tokenizer=tok,
        train_data=[Prompt("1+1=", {"answer": "2"})],
        training=TrainingConfig(prompts_per_step=2),
        rollout=RolloutConfig(max_new_tokens=4),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), _nan_on_bad]),
    )
    prompts = [Prompt("1+1=", {"answer": "2"}), Prompt("2+2=", {"answer": "4"})]
    groups = make_groups(
        prompts,
        [0, 0, 0, 0],
        group_size=2,
        completion_tokens=np.full((4, 4), 5),
        lengths=[2, 3, 4, 1],
        texts=["2", "3", "bad", "4"],  # the NaN is the first completion of the second group
    )
    with pytest.raises(rewards.RewardError, match="_nan_on_bad") as info:
        learner._score(groups)
    assert info.value.function == "_nan_on_bad"
    assert info.value.index == 2
    assert "bad" in str(info.value)


# -- the package stays small and is discovered, never imported for its side effect ---------


def test_code_line_counter_on_a_known_snippet():
    source = (
        '"""Doc."""\n\n# comment\nimport os  # trailing\n\n'
        'class A:\n    """Doc\n    two."""\n\n    x: int = 1\n    """Field doc."""\n'
    )
    assert _code_lines(source) == [4, 6, 10]


def test_package_body_is_under_twenty_lines():
    files = sorted((PACKAGE / "src" / "algo_dr_grpo").rglob("*.py"))
    assert files, "no Python files found in algo-dr-grpo"
    counts = {f.name: len(_code_lines(f.read_text())) for f in files}
    assert sum(counts.values()) < 20, f"algo-dr-grpo has {sum(counts.values())} code lines: {counts}"


def test_entry_point_is_declared_and_installed():
    pyproject = tomllib.loads((PACKAGE / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["rl_core.algorithms"] == {"dr_grpo": "algo_dr_grpo:ALGORITHM"}
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="rl_core.algorithms")}
    assert installed["dr_grpo"] == "algo_dr_grpo:ALGORITHM"
    assert set(pyproject["project"]["dependencies"]) == {"rl-core", "algo-grpo"}


def test_nothing_imports_it_for_side_effects():
    pattern = re.compile(r"^\s*(import\s+algo_dr_grpo|from\s+algo_dr_grpo[\s.])", re.MULTILINE)
    offenders = [
        str(path.relative_to(REPO))
        for top in ("packages", "apps")
        for path in (REPO / top).rglob("*.py")
        if PACKAGE not in path.parents and pattern.search(path.read_text(errors="replace"))
    ]
    assert offenders == []
