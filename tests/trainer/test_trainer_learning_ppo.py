"""PPO must learn: at GRPO's rollout budget, held-out accuracy rises and the critic explains returns."""

import pytest


@pytest.mark.slow
def test_100_ppo_steps_raise_heldout_accuracy_and_the_critic_explains_heldout_returns(learn):
    # One completion per prompt and 256 prompts a step: the 256 completions GRPO's learning runs
    # generate (32 prompts x 8). Four mini-batches give the critic four updates a step. Measured
    # from the cached base (0.445) with rollout seed 0, 100 steps: accuracy +43 points (0.875), and
    # the critic's explained variance of the Monte Carlo return on held-out rollouts rose from 0 to
    # 0.19 (0.16 to 0.23 over the settings tried: critic lr 1e-3 to 3e-3, lambda 0.8 or 0.95, a
    # 20-step critic warm-up). It needs about 200 steps to pass 0.3 (0.32 at step 200): at first
    # only the prompt predicts the return (about 0.2 of its variance on this task), and judging
    # an answer's digits is a skill the critic's own copy of the backbone learns slowly. The bars:
    # +15 points (the issue's) and 0.1, half the measured fit and far above a critic that learned
    # nothing (0: it predicts the mean).
    before, after, final = learn("ppo", ["training.prompts_per_step=256", "training.mini_batch_size=64"],
                                 final_metrics=True)
    assert 0.2 < before < 0.7
    assert after >= before + 0.15, (before, after)
    assert final["eval/critic_explained_variance"] > 0.1, final
