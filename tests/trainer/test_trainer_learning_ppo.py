"""PPO must learn: at GRPO's rollout budget, held-out accuracy rises and the critic explains returns."""

import pytest


@pytest.mark.slow
def test_50_ppo_steps_raise_heldout_accuracy_and_the_critic_explains_heldout_returns(learn):
    # One completion per prompt and 256 prompts a step: the 256 completions GRPO's learning runs
    # generate (32 prompts x 8). Four mini-batches give the critic four updates a step. Measured
    # (benchmarks/ppo_critic.py runs the same and goes on; the README's PPO section), run alone on
    # one core: 0.445 -> 0.770, the critic's explained variance of the Monte Carlo return on these
    # 200 held-out rollouts 0.296 (0.25-0.26 on 500 problems, two seeds; 0.33-0.36 by step 200).
    # From the base a full-suite run makes (two busy cores round the warm start differently) the
    # fit is lower: 0.16 at step 50 on 500 problems, 0.27 at step 200; without the critic's
    # confidence head 0.07 and 0.20. A critic that knew whether the digits so far begin the right
    # sum would explain 0.55: neither critic learns to check an answer the policy wrote with
    # confidence. The 0.3 is not reached in a suite-sized run from every base. The bars:
    # +15 points (the issue's), and a fit above 0.1, which a critic that learned nothing (it
    # predicts the mean: 0) fails.
    before, after, final = learn("ppo", ["training.prompts_per_step=256", "training.mini_batch_size=64",
                                         "training.num_steps=50"], final_metrics=True)
    print(f"critic explained variance (held-out): {final['eval/critic_explained_variance']:.3f}")
    assert 0.2 < before < 0.7
    assert after >= before + 0.15, (before, after)
    assert final["eval/critic_explained_variance"] > 0.1, final
