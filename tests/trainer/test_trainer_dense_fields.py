"""`trainer plan`, `train` and `serve` on dense folders with bias flags or dynamic rope: Llama-style
attention and MLP biases are parameters plan counts; dynamic NTK rope runs only within the folder's
max_position_embeddings, and longer settings fail before anything compiles."""

import json
import shutil
from math import prod
from pathlib import Path

import pytest
from safetensors import safe_open
from trainer.cli import main
from trainer.plan import memory_budget, plan
from trainer.settings import build_settings

FOLDER = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "llama_bias"


def dynamic_folder(tmp_path):
    """llama_bias with dynamic NTK rope (factor 4) up to 64 positions."""
    folder = tmp_path / "dynamic"
    shutil.copytree(FOLDER, folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("rope_parameters", None)
    config |= {"rope_theta": 10000.0, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0},
               "max_position_embeddings": 64}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.e2e  # compiles the learner's programs on abstract shapes (~7 s on CPU)
def test_plan_counts_the_bias_parameters():
    """The parameters it plans for are exactly the folder's tensors, q/k/v/o and gate/up/down biases included."""
    settings = build_settings(algo="grpo", overrides=[f"model.path={FOLDER}", "training.prompts_per_step=2",
                                                      "algorithm.group_size=2"])
    result = plan(settings, memory_budget("gpu"))
    with safe_open(FOLDER / "model.safetensors", framework="np") as f:
        shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
    biases = sum(prod(s) for k, s in shapes.items() if k.endswith(".bias"))
    # 2 layers x (q 64 + k 32 + v 32 + o 64 + gate 128 + up 128 + down 64)
    assert biases == 2 * 512
    assert result.parameters == sum(prod(s) for s in shapes.values())


def test_plan_refuses_lengths_past_a_dynamic_ropes_limit_before_compiling(tmp_path, capsys):
    folder = dynamic_folder(tmp_path)
    code = main(["plan", "--algo", "grpo", f"model.path={folder}", "rollout.max_prompt_tokens=40",
                 "rollout.max_new_tokens=32"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert ("rollout.max_prompt_tokens + 1 + rollout.max_new_tokens = 73: sequences of up to 73 tokens pass the "
            "model's max_position_embeddings (64)") in err


def test_a_run_is_built_only_when_its_longest_sequence_fits_the_dynamic_ropes_limit():
    """`trainer train` builds its model through the same check: a prompt, a BOS and the completion."""
    from rl_core import ConfigError
    from rl_core.config import RolloutConfig
    from rl_models import TransformerConfig
    from rl_models.rope_types import DynamicNTKRope
    from trainer.checks import check_positions

    config = TransformerConfig.tiny(40, rope_scaling=DynamicNTKRope(factor=2.0, max_position_embeddings=64))
    check_positions(config, RolloutConfig(max_prompt_tokens=31, max_new_tokens=32))  # 64 tokens: exact
    with pytest.raises(ConfigError, match=r"= 65: sequences of up to 65 tokens pass"):
        check_positions(config, RolloutConfig(max_prompt_tokens=32, max_new_tokens=32))


def test_serve_refuses_lengths_past_a_dynamic_ropes_limit(tmp_path):
    from rl_core import ConfigError
    from trainer.serve import EngineOptions, served_folder

    folder = dynamic_folder(tmp_path)
    with pytest.raises(ConfigError, match=r"--max-prompt-tokens \+ --max-new-tokens = 3072: sequences of up to 3072"):
        served_folder(folder, EngineOptions())  # 2048 + 1024 by default
