"""GSPO must learn: 100 steps on the built-in task raise held-out accuracy, on average over seeds."""

import pytest


@pytest.mark.slow
def test_100_gspo_steps_raise_heldout_greedy_accuracy_on_average_over_three_seeds(learn):
    # GSPO weighs each token by 1/|y| (its ratio is a per-sequence mean), so per step it
    # learns more slowly than the token-sum variants: one 100-step run rose by 13.5, 17.0,
    # 18.0 and 14.0 points with rollout seeds 0 to 3 here (1.5e-3 and 3e-3 learning rates
    # did worse). A single seed sits on the 15-point bar; the mean of three tests the method.
    runs = [learn("gspo", [f"rollout.seed={seed}"], f"gspo-{seed}") for seed in (0, 1, 2)]
    rises = [after - before for before, after in runs]
    assert sum(rises) / 3 >= 0.15, rises
