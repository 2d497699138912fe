"""`trainer explain`: one group scored by hand under each algorithm's defaults.

Every expected value is derived in the comments from the formulas in the algorithm READMEs.
"""

from __future__ import annotations

import math

import pytest
from trainer.cli import main
from trainer.explain import ExplainInputError, explain, explain_algorithm, parse_group
from tolerances import approx

# rewards 1,0,0,1: mean 0.5, std (ddof=1) = sqrt(4 * 0.25 / 3) = 0.57735
GRPO_A = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # 0.866024
DR_A = 0.5  # r - mean(r), no std division


def test_advantages_per_estimator():
    group = parse_group("1,0,0,1")
    grpo = explain_algorithm("grpo", group)
    dr = explain_algorithm("dr_grpo", group)
    assert grpo.advantages == pytest.approx([GRPO_A, -GRPO_A, -GRPO_A, GRPO_A], abs=1e-5)
    assert dr.advantages == pytest.approx([DR_A, -DR_A, -DR_A, DR_A], abs=1e-6)
    # relation between variants: dr_grpo advantage / group std == grpo advantage
    assert [a / math.sqrt(1 / 3) for a in dr.advantages] == pytest.approx(grpo.advantages, abs=1e-4)
    assert not grpo.uniform and grpo.note == ""


def test_clip_higher_discriminates_grpo_from_dapo():
    # ratio 1.25 on a positive advantage: above GRPO's 1 + 0.2, below DAPO's 1 + 0.28.
    # ratio 0.7 on a negative advantage: below 1 - 0.2 under both.
    group = parse_group("1,0,0,1", ratios="1.25,0.7,1,1")
    grpo = explain_algorithm("grpo", group)
    dapo = explain_algorithm("dapo", group)
    assert grpo.clip == ("high", "low", "none", "none")
    assert dapo.clip == ("none", "low", "none", "none")
    # grpo: -min(1.25 A, 1.2 A) = -1.2 A = -1.03923; dapo: -1.25 A = -1.08253
    assert grpo.surrogate[0] == approx(-1.2 * GRPO_A, abs=1e-5)
    assert dapo.surrogate[0] == approx(-1.25 * GRPO_A, abs=1e-5)
    # negative advantage, ratio 0.7: -min(0.7 * -A, 0.8 * -A) = 0.8 A = 0.69282
    assert grpo.surrogate[1] == approx(0.8 * GRPO_A, abs=1e-5)
    # ratio 1 gives -A
    assert grpo.surrogate[2:] == approx([GRPO_A, -GRPO_A], abs=1e-5)


def test_aggregation_modes_with_lengths():
    # per-token losses under grpo / dapo: [-1.2A, 0.8A, A, -A]; under dr_grpo (A = 0.5): [-0.6, 0.4, 0.5, -0.5]
    group = parse_group("1,0,0,1", ratios="1.25,0.7,1,1", lengths="2,4,3,4", kl=0.01)
    a = GRPO_A
    # grpo, seq-mean-token-mean: each sequence's token mean is its per-token loss -> plain mean
    grpo = explain_algorithm("grpo", group)
    assert grpo.policy_loss == approx((-1.2 * a + 0.8 * a + a - a) / 4, abs=1e-5)  # -0.0866
    # the KL term: beta * KL = 0.04 * 0.01 = 4e-4 per token, and its sequence means are 4e-4 too
    assert grpo.kl_term == pytest.approx(4e-4)
    assert grpo.kl_loss == pytest.approx(4e-4, abs=1e-7)
    assert grpo.loss == approx(grpo.policy_loss + 4e-4, abs=1e-6)
    # dapo, token-mean: (2 * -1.25A + 4 * 0.8A + 3 * A + 4 * -A) / 13 tokens = -0.3A / 13 = -0.019985
    dapo = explain_algorithm("dapo", group)
    assert dapo.loss == approx((2 * -1.25 * a + 4 * 0.8 * a + 3 * a - 4 * a) / 13, abs=1e-5)
    assert dapo.kl_loss == 0.0  # beta = 0: no KL term at all
    # dr_grpo, seq-mean-token-sum-norm: token sums (-1.2, 1.6, 1.5, -2.0) / L_max 4, mean of 4 = -0.00625
    dr = explain_algorithm("dr_grpo", group)
    assert dr.loss == approx((-1.2 + 1.6 + 1.5 - 2.0) / 4 / 4, abs=1e-6)


def test_tied_group_has_exact_zero_advantages():
    group = parse_group("1,1,1,1", kl=0.02)
    for name in ("grpo", "dr_grpo", "dapo"):
        e = explain_algorithm(name, group)
        assert e.uniform
        assert e.advantages == (0.0, 0.0, 0.0, 0.0)  # exactly, not approximately
        assert e.surrogate == (0.0, 0.0, 0.0, 0.0)
    grpo = explain_algorithm("grpo", group)
    assert "only the KL term remains" in grpo.note
    assert grpo.loss == pytest.approx(0.04 * 0.02)
    dr = explain_algorithm("dr_grpo", group)
    assert "contributes nothing" in dr.note and dr.loss == 0.0
    assert "dynamic sampling drops it" in explain_algorithm("dapo", group).note


def test_distillation_is_named_beside_the_rewards_advantages():
    """opd's rewards give no advantage ("zero"); its teacher's per-token term is named, not computed."""
    for rewards in ("1,0,0,1", "1,1,1,1"):
        e = explain_algorithm("opd", parse_group(rewards))
        assert e.advantages == (0.0, 0.0, 0.0, 0.0) and e.loss == 0.0
        assert "distill_coef * (log pi_teacher - log pi_old) = 1 * (...)" in e.note
        assert ("contributes nothing" not in e.note) and (e.uniform == ("from the rewards is exactly 0" in e.note))
    assert "distill" not in explain_algorithm("grpo", parse_group("1,0,0,1")).note


def test_report_lists_every_installed_algorithm():
    text = explain(rewards="1,1,1,1")
    for name in ("grpo", "dr_grpo", "dapo"):
        assert f"\n{name}: advantages" in text
    assert "uniform (tied) group" in text
    assert "only the KL term remains" in text


def test_cli_prints_report(capsys):
    assert main(["explain", "--rewards", "1,0,0,1", "--ratios", "1.25,0.7,1,1"]) == 0
    out = capsys.readouterr().out
    assert "+0.8660" in out and "-0.8660" in out  # grpo / dapo advantages
    assert "+0.5000" in out  # dr_grpo


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--rewards", "1,x,0"], "--rewards"),
        (["--rewards", "1"], "--rewards"),
        (["--rewards", ""], "--rewards"),
        (["--rewards", "1,0", "--ratios", "1,1,1"], "--ratios"),
        (["--rewards", "1,0", "--ratios", "1,0"], "--ratios"),
        (["--rewards", "1,0", "--ratios", "1,-2"], "--ratios"),
        (["--rewards", "1,0", "--lengths", "2,2.5"], "--lengths"),
        (["--rewards", "1,0", "--lengths", "3"], "--lengths"),
        (["--rewards", "1,0", "--kl", "nan"], "--kl"),
    ],
)
def test_bad_input_exits_2_naming_the_argument(argv, named, capsys):
    assert main(["explain", *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and "error" in err


def test_bad_input_raises_a_value_error():
    with pytest.raises(ExplainInputError, match="--ratios"):
        parse_group([1.0, 0.0], ratios=[1.0])


def test_a_sequence_level_loss_is_explained_per_completion():
    # GSPO returns one term per completion; with every token of a completion sharing rho, its
    # ratio is rho itself. GRPO advantages of [1, 0, 0, 1]: +-0.5 / sqrt(1/3) = +-a, a = 0.8660254.
    # Clip [1 - 3e-4, 1 + 4e-4]: rho 1.25 with A > 0 -> -(1.0004 a); rho 0.7 with A < 0 -> +(0.9997 a).
    a = 0.5 / math.sqrt(1 / 3)
    gspo = explain_algorithm("gspo", parse_group("1,0,0,1", "1.25,0.7,1,1"))
    assert gspo.surrogate == approx((-1.0004 * a, 0.9997 * a, a, -a), abs=1e-4)
    assert gspo.clip == ("high", "low", "none", "none")
