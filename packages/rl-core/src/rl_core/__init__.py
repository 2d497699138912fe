"""rl_core: base learner, registry, configs, sampler and shared math."""
