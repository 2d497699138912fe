"""A learner's public names are the ones docs/concepts/architecture.md lists (#55): what a caller
uses, each read somewhere outside the tests and the learner's own files. The hooks and pipeline
steps an algorithm overrides or calls are protected (rl_core.learner.hooks says why); the page
lists them too. Every registered algorithm's learner is held to the lists, with the names its
algorithm adds (`EXTRA`). A new public name on a learner, or one gone, fails here until the
lists (and the page) say so."""

import re
from pathlib import Path

import invariance_contract as contract
import pytest
from rl_core import registry

ROOT = Path(__file__).resolve().parents[2]
CALLER = {
    "training", "rollout", "tokenizer", "reward_manager", "layout", "models", "policy", "generator",  # settings, parts
    "state", "step", "params", "supply",  # the state, and what the next collection draws on
    "policy_params", "model",  # the policy as evaluation and export take it
    "train", "train_step", "request_stop", "resume", "close",  # the loop
    "produce_examples", "update_models",  # a step's halves apart (benchmarks)
    "heldout_metrics", "extra_models", "loss_of", "example_spec",  # the algorithm, as evaluation and plan read it
}
PROTECTED = {  # the algorithm's side: what it reads, rl_core.learner.hooks, then rl_core.learner.pipeline's steps
    "_config", "_generate", "_recorder",
    "_collect", "_collection", "_examples_from", "_loss_function", "_models_to_update", "_add_model",
    "_sample_groups", "_rollout_groups", "_score", "_record_behaviour_logprobs", "_example_from_groups",
    "_compute_advantages", "_to_example", "_add_logprobs", "_group_metrics", "_samples",
}
EXTRA = {  # an algorithm's public names beyond CALLER (the others add none)
    "ppo": {"critic_loss_function",  # its critic's loss, which `trainer plan` compiles
            "critic_values", "heldout_rollouts"},  # the critic's values on held-out rollouts (the critic benchmarks)
}
LEARNER_FILES = {"base.py", "hooks.py", "pipeline.py"}
ALGORITHMS = registry.registry.names("algorithm")  # loads every entry point first


def test_the_extra_names_are_of_registered_algorithms():
    assert set(EXTRA) <= set(ALGORITHMS), sorted(set(EXTRA) - set(ALGORITHMS))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_a_learner_has_the_listed_public_names_only_and_the_listed_steps(name):
    algorithm = registry.get_algorithm(name)
    learner = contract.learner(algorithm, algorithm.config(), {})
    try:
        names = {n for n in dir(learner) if not n.startswith("_")}
        missing_steps = sorted(n for n in PROTECTED if not hasattr(learner, n))
    finally:
        learner.close()
    listed = CALLER | EXTRA.get(name, set())
    assert names == listed, (sorted(names - listed), sorted(listed - names))
    assert not missing_steps


def test_every_public_name_of_the_learner_has_a_reader_outside_the_tests():
    sources = [p for folder in ("apps", "benchmarks", "packages") for p in (ROOT / folder).rglob("*.py")
               if ".venv" not in p.parts and not (p.parent.name == "learner" and p.name in LEARNER_FILES)]
    text = "\n".join(p.read_text() for p in sources)
    # read as `<something>learner<something>.name` (a learner class's too: plan reads `Algorithm.learner.loss_of`)
    unread = sorted(n for n in CALLER.union(*EXTRA.values()) if not re.search(rf"\w*learner\w*\)?\.{n}\b", text))
    assert not unread, f"public names of the learner that nothing outside the tests reads: {unread}"
