"""GSPO must learn: 100 steps on the built-in task raise held-out accuracy, on average over seeds."""

import pytest


@pytest.mark.slow
def test_100_gspo_steps_raise_heldout_greedy_accuracy_on_average_over_three_seeds(learn):
    # GSPO weighs each token by 1/|y| (its ratio is a per-sequence mean), so per step it
    # can learn more slowly than the token-sum variants. Rollout seeds 0-2 rose by 20.0, 21.5
    # and 21.0 points; under other XLA flags (another rounding) single runs rose by only 13.5
    # to 18 (1.5e-3 and 3e-3 learning rates did worse). The mean of three tests the method,
    # not one seed's luck.
    runs = [learn("gspo", [f"rollout.seed={seed}"], f"gspo-{seed}") for seed in (0, 1, 2)]
    rises = [after - before for before, after in runs]
    assert sum(rises) / 3 >= 0.15, rises
