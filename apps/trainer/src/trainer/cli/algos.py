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
        doc = next(iter((algo.learner.__doc__ or algo.config.__doc__ or "").strip().splitlines()), "")
        print(f"{name:{width[0]}s} {providers[name]:{width[1]}s} {doc}")
    for why in registry.registry.load_failures.values():
        print(f"(failed to load: {why})")
    return 0
