"""`trainer algos`: the installed algorithms."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    sub.add_parser("algos", help="installed algorithms")


def run(args: argparse.Namespace) -> int:
    from rl_core import registry

    names = registry.registry.names("algorithm")
    providers = {name: registry.registry.provider("algorithm", name) for name in names}
    width = max(map(len, names), default=0), max(map(len, providers.values()), default=0)
    for name in names:
        algo = registry.get_algorithm(name)
        doc = next(iter(_description(algo).strip().splitlines()), "")
        print(f"{name:{width[0]}s} {providers[name]:{width[1]}s} {doc}")
    for why in registry.registry.load_failures.values():
        print(f"(failed to load: {why})")
    return 0


def _description(algo) -> str:
    """The learner's docstring when the algorithm's own package defines its learner; else its config's
    (OPD runs GRPO's learner unchanged: GRPO's text would describe GRPO)."""
    own = algo.config.__module__.split(".")[0]
    if algo.learner.__module__.split(".")[0] == own and algo.learner.__doc__:
        return algo.learner.__doc__
    return algo.config.__doc__ or ""
