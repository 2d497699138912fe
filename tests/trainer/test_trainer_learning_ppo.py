"""PPO must learn: at GRPO's rollout budget, held-out accuracy rises and the critic explains returns."""

import pytest


@pytest.mark.slow
def test_50_ppo_steps_raise_heldout_accuracy_and_the_critic_explains_heldout_returns(learn):
    # One completion per prompt and 256 prompts a step: the 256 completions GRPO's learning runs
    # generate (32 prompts x 8). Four mini-batches give the critic four updates a step. Measured
    # with rollout seed 0: 50 steps from the cached base 0.445 -> 0.775 (+33 points); 100 steps
    # 0.445 -> 0.875 (+43) and 0.475 -> 0.760 (+28.5, in a full-suite run whose base evaluated
    # 6 problems higher). The critic's explained variance of the Monte Carlo return on held-out
    # rollouts at 100 steps: 0.19 and 0.097 in those two runs (0.16 to 0.23 over the settings
    # tried: critic lr 1e-3 to 3e-3, lambda 0.8 or 0.95, a 20-step critic warm-up); it needs about
    # 200 steps to pass 0.3 (0.32 at step 200): at first only the prompt predicts the return, and
    # judging an answer's digits is a skill the critic's own copy of the backbone learns slowly.
    # The bars: +15 points (the issue's), and a fit above 0.03, which a critic that learned
    # nothing (it predicts the mean: 0) fails; the 0.3 is not reached in a suite-sized run.
    before, after, final = learn("ppo", ["training.prompts_per_step=256", "training.mini_batch_size=64",
                                         "training.num_steps=50"], final_metrics=True)
    print(f"critic explained variance (held-out): {final['eval/critic_explained_variance']:.3f}")
    assert 0.2 < before < 0.7
    assert after >= before + 0.15, (before, after)
    assert final["eval/critic_explained_variance"] > 0.03, final
