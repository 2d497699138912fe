"""A GRPO step on the committed tiny Gemma 4 text folder (tests/fixtures/hf/gemma4_text: global
layers of their own shape, keys as values, KV shared by the last layers, per-layer inputs) through
`trainer train`, on the static sampler and on the paged engine."""

import json
from pathlib import Path

import pytest

from trainer.cli import main

from gsm8k_step import one_step_argv

GEMMA4 = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "gemma4_text"


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ["static", "paged"])
def test_a_grpo_step_on_gemma4(tmp_path, engine):
    assert main(one_step_argv(GEMMA4, tmp_path, f"rollout.engine={engine}")) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["skipped_updates"] == 0
