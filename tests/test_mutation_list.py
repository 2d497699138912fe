"""The on-demand mutation check (benchmarks/mutation_check.py) still applies: each
mutation's line occurs exactly once in its source file, so a source edit that moves a
line shows up here in every run, not months later as NOT APPLIED."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("mutation_check", ROOT / "benchmarks" / "mutation_check.py")
mutation_check = importlib.util.module_from_spec(spec)
sys.modules["mutation_check"] = mutation_check  # its dataclasses look their module up
spec.loader.exec_module(mutation_check)


@pytest.mark.parametrize("mutation", mutation_check.MUTATIONS, ids=lambda m: m.name)
def test_each_mutation_line_occurs_once_and_its_tests_exist(mutation):
    text = (ROOT / mutation.path).read_text()
    assert text.count(mutation.old) == 1, f"{mutation.name}: update its line in benchmarks/mutation_check.py"
    assert mutation.new != mutation.old
    for arg in mutation.tests:
        if arg.startswith("tests/"):
            assert (ROOT / arg.split("::")[0]).is_file(), arg
