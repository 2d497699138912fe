"""A learner's public names are the ones docs/concepts/architecture.md lists: what a caller uses
and what an algorithm package overrides or calls (#55). A new public name on the learner, or
one gone, fails here until the list (and the page) says so."""

import invariance_contract as contract
from rl_core import registry

CALLER = {
    "config", "training", "rollout", "tokenizer", "layout", "models", "policy", "generator", "recorder",
    "reward_manager",  # settings and parts
    "state", "step", "params", "replace_state",  # the state
    "policy_params", "model", "generate",  # the policy as evaluation and export take it
    "train", "train_step", "request_stop", "save_checkpoint", "resume", "close",  # the loop
    "supply", "produce_examples", "update_models",  # a step's halves apart (benchmarks)
}
ALGORITHM = {
    "collect", "collection", "examples_from", "loss_function", "num_iterations", "group_size", "models_to_update",
    "heldout_metrics", "extra_models", "add_model",  # the hooks (rl_core.learner.hooks)
    "sample_groups", "rollout_groups", "score", "record_behaviour_logprobs", "example_from_groups",
    "compute_advantages", "to_example", "add_logprobs", "group_metrics", "samples", "loss_of", "example_spec",
}


def test_a_grpo_learner_has_the_listed_public_names_only():
    algorithm = registry.get_algorithm("grpo")
    learner = contract.learner(algorithm, algorithm.config(), {})
    try:
        names = {n for n in dir(learner) if not n.startswith("_")}
    finally:
        learner.close()
    assert names == CALLER | ALGORITHM, (sorted(names - CALLER - ALGORITHM), sorted(CALLER | ALGORITHM - names))
