"""The learner: the base RL learner, its state, the rollout/update pipeline, groups and meters."""
