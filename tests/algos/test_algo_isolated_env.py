"""Depend on only what you need: DAPO trains in an environment without
algo-dr-grpo (nor the trainer), and asking for 'dr_grpo' there names the
distribution to install."""

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from host import need_uv

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
MEMBERS = ["rl-plugins", "rl-core", "rl-models", "rewards", "algo-grpo", "algo-dapo"]

SCRIPT = textwrap.dedent(
    """
    import importlib.metadata, importlib.util, json, math
    import numpy as np
    import rl_models, rewards
    from flax import nnx
    from rl_core import registry
    from rl_core.config import RolloutConfig, TrainingConfig
    from rl_core.data import Prompt

    out = {
        "algorithms": registry.registry.names("algorithm"),
        "dr_grpo_importable": importlib.util.find_spec("algo_dr_grpo") is not None,
        "trainer_importable": importlib.util.find_spec("trainer") is not None,
        "distributions": sorted(d.metadata["Name"] for d in importlib.metadata.distributions()),
    }
    try:
        registry.get_algorithm("dr_grpo")
        out["dr_grpo_error"] = None
    except registry.RegistryError as e:
        out["dr_grpo_error"] = str(e)

    dapo = registry.get_algorithm("dapo")
    config = dapo.config(group_size=2)
    tok = rl_models.CharTokenizer()
    model = rl_models.TransformerConfig.tiny(
        tok.vocab_size, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, mlp_hidden_size=32
    )

    def digit_fraction(prompts, completions, **_):
        return [sum(c.isdigit() for c in t) / max(len(t), 1) for t in completions]

    learner = dapo.learner(
        config,
        policy=rl_models.Transformer(model, rngs=nnx.Rngs(0)),
        tokenizer=tok,
        train_data=[Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 10) for b in range(1, 10)],
        training=TrainingConfig(prompts_per_step=2, num_steps=1, learning_rate=1e-3),
        rollout=RolloutConfig(max_new_tokens=4, max_prompt_tokens=8),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), digit_fraction]),
    )
    metrics = learner.train_step()
    out["loss"] = metrics["train/loss"]
    out["step"] = learner.step
    out["gen_rounds"] = metrics["dapo/gen_rounds"]
    print("RESULT " + json.dumps(out))
    """
)


def _run(cmd: list[str], cwd: Path = REPO, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def isolated_python(tmp_path_factory) -> Path:
    need_uv()
    uv = shutil.which("uv")
    root = tmp_path_factory.mktemp("isolated")
    venv = root / "venv"
    made = _run([uv, "venv", str(venv), "--python", f"{sys.version_info.major}.{sys.version_info.minor}", "-q"])
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    # Pin every third-party version to the workspace lock; install the members editable.
    exported = _run(
        [uv, "export", "--frozen", "--no-hashes", "--no-dev", "--no-annotate", "--no-header",
         *(arg for m in ("algo-dapo", "rl-models", "rewards") for arg in ("--package", m)),
         "-o", str(root / "requirements.txt")]
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr
    requirements = (root / "requirements.txt").read_text()
    members = {line.split("/")[-1] for line in requirements.splitlines() if line.startswith("-e ")}
    assert members == set(MEMBERS), f"the export should hold exactly these members: {members}"
    install = [uv, "pip", "install", "--python", str(python), "-q", "-r", str(root / "requirements.txt")]
    done = _run([*install, "--offline"])
    if done.returncode != 0:  # the cache lacks an index entry: let uv reach the package index
        done = _run(install)
    assert done.returncode == 0, done.stderr
    return python


def test_dapo_trains_without_dr_grpo(isolated_python, tmp_path):
    # Run outside the repository so that nothing is importable from the working directory.
    # (the suite's XLA_FLAGS go along: they make XLA compile the same programs faster)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")}
    result = _run([str(isolated_python), "-c", SCRIPT], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    out = json.loads(line.removeprefix("RESULT "))

    installed = set(out["distributions"])
    assert set(MEMBERS) <= installed
    assert not {"algo-dr-grpo", "trainer", "rl-variants"} & installed
    assert not out["dr_grpo_importable"] and not out["trainer_importable"]
    assert out["algorithms"] == ["dapo", "grpo"]

    assert out["step"] == 1 and out["gen_rounds"] >= 1
    assert math.isfinite(out["loss"])

    message = out["dr_grpo_error"]
    assert message is not None
    assert "unknown algorithm 'dr_grpo'" in message
    assert "algo-dr-grpo" in message  # the distribution to install
    assert "dapo (from algo-dapo)" in message and "grpo (from algo-grpo)" in message
