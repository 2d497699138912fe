"""An algorithm package installed only for this test is listed and compared, with no change to the trainer.

`fixtures/algo_fixture_rloo.py` is a dozen-line algorithm (GRPO with the
leave-one-out baseline). The test "installs" it the way an installer would
lay it out: the module plus an `algo_fixture_rloo-0.1.0.dist-info` folder
(METADATA and entry_points.txt) in a temporary folder, which a fresh `trainer`
process gets on PYTHONPATH. Nothing in the workspace changes, and this pytest
process never sees the package: a fresh process is the point.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from trainer.cli import main

pytestmark = pytest.mark.e2e

FIXTURE = Path(__file__).parent / "fixtures" / "algo_fixture_rloo.py"
TINY = [
    "task.name=countdown",  # its format reward makes groups informative, so advantages are not all 0
    "warm_start.steps=20",
    "training.num_steps=2",
    "training.prompts_per_step=4",
    "algorithm.group_size=2",
    "eval.heldout_size=16",
    "eval.samples_per_prompt=2",
    "eval.pass_k=1",
    "eval.every_steps=0",
    "training.samples_per_step=8",  # every completion, to check every advantage
]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A folder that looks like site-packages holding only the fixture distribution."""
    site = tmp_path_factory.mktemp("site")
    shutil.copy(FIXTURE, site / FIXTURE.name)
    info = site / "algo_fixture_rloo-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: algo-fixture-rloo\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[rl_core.algorithms]\nfixture_rloo = algo_fixture_rloo:ALGORITHM\n")
    (info / "top_level.txt").write_text("algo_fixture_rloo\n")
    return site


def trainer(site: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`trainer ARGS` in a fresh process with `site` on PYTHONPATH."""
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "trainer.cli", *args],
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_fixture_is_not_installed_in_the_workspace(capsys):
    assert main(["algos"]) == 0
    assert "fixture_rloo" not in capsys.readouterr().out


def test_algos_lists_the_fixture_with_its_distribution(site):
    result = trainer(site, "algos")
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert set(rows) == {
        "grpo", "dr_grpo", "dapo", "rloo", "gspo", "cispo", "reinforce_pp", "ppo", "sapo", "dppo", "opd",
        "fixture_rloo",
    }
    assert rows["fixture_rloo"].split()[1] == "algo-fixture-rloo"
    assert "leave-one-out" in rows["fixture_rloo"]
    assert "failed to load" not in result.stdout


def test_compare_runs_the_fixture_beside_grpo(site, tmp_path):
    out = tmp_path / "compare"
    # both variants share most compiled programs; the persistent cache lets the second reuse them
    cache = {"JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax-cache")}
    result = trainer(site, "compare", "fixture_rloo", "grpo", "--output", str(out), "--seeds", "1", "--no-progress", *TINY, env=cache)
    assert result.returncode == 0, result.stderr[-3000:]

    table = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in table[1:]] == ["fixture_rloo", "grpo"]
    variants = json.loads((out / "results.json").read_text())["variants"]
    assert [v["algo"] for v in variants] == ["fixture_rloo", "grpo"]
    summaries = [v["summaries"][0] for v in variants]  # one seed each
    assert all(s["steps"] == 2 for s in summaries)
    assert summaries[0]["before"] == summaries[1]["before"]  # the same base policy
    assert len(list(out.glob("base-policy-*"))) == 1

    # the fixture's own config was in effect: its resolved settings and its advantages are RLOO's
    assert "advantage_estimator: rloo" in (out / "fixture_rloo" / "seed-0" / "config.yaml").read_text()
    assert "advantage_estimator: grpo" in (out / "grpo" / "seed-0" / "config.yaml").read_text()
    for algo in ("fixture_rloo", "grpo"):
        samples = [json.loads(line) for line in (out / algo / "seed-0" / "samples.jsonl").read_text().splitlines()]
        rewards = np.array([s["reward"] for s in samples]).reshape(-1, 2)  # groups of G = 2
        adv = np.array([s["advantage"] for s in samples]).reshape(-1, 2)
        assert (rewards[:, 0] != rewards[:, 1]).any(), "some groups should be informative"
        if algo == "fixture_rloo":
            # leave-one-out with G = 2: A_0 = r_0 - r_1, A_1 = r_1 - r_0
            expected = rewards - rewards[:, ::-1]
        else:
            # GRPO: (r_i - mean) / (std_ddof1 + 1e-6); with G = 2 that is about +-0.7071 for any unequal pair
            centered = rewards - rewards.mean(axis=1, keepdims=True)
            expected = centered / (rewards.std(axis=1, ddof=1, keepdims=True) + 1e-6)
        np.testing.assert_allclose(adv, expected, atol=1e-5)
