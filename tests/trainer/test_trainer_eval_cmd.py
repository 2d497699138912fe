"""`trainer eval --run DIR`: the unbiased pass@k and the evaluation of a trained run folder."""

from __future__ import annotations

import json
from math import comb

import jax
import numpy as np
import pytest
import trainer.run.saved_run
from flax import nnx
from rl_models import CharTokenizer
from trainer import build
from trainer.cli import main
from trainer.evaluate import evaluate, pass_at_k
from trainer.run.saved_run import evaluate_run
from trainer.run import settings_of_run
from tolerances import close


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 1, 0.4),  # 1 - C(3,1)/C(5,1) = 1 - 3/5: the plain fraction correct
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 0, 3, 0.0),  # nothing correct: no k-subset can pass
        (5, 3, 3, 1.0),  # n - c = 2 < k = 3: every 3-subset holds a correct sample
        (5, 5, 1, 1.0),
        (8, 1, 4, 0.5),  # 1 - C(7,4)/C(8,4) = 1 - 35/70
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_the_definition():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                # probability that a random k-subset of the n samples holds at least one correct one
                expected = 1.0 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_eval_of_a_run_matches_its_final_summary(trained_run, decay_per_step, capsys, monkeypatch):
    evaluated = []

    def recording_evaluate(sampler, params, *args, **kwargs):
        evaluated.append(params)
        return evaluate(sampler, params, *args, **kwargs)

    monkeypatch.setattr(trainer.run.saved_run, "evaluate", recording_evaluate)
    capsys.readouterr()
    before = _snapshot(trained_run)
    assert main(["eval", "--run", str(trained_run)]) == 0
    result = json.loads(capsys.readouterr().out)
    summary = json.loads((trained_run / "summary.json").read_text())
    assert result["step"] == summary["steps"] == 2
    assert result["k"] == 2 and result["samples_per_prompt"] == 4 and result["heldout_size"] == 16
    assert 0.0 <= result["eval/accuracy"] <= 1.0
    assert 0.0 <= result["eval/pass@2"] <= 1.0
    # the same checkpointed params, prompts, programs and seed: identical numbers
    for key, value in summary["after"].items():
        assert result[key] == value, key
    # the evaluation only reads the run folder
    assert _snapshot(trained_run) == before
    # and it evaluated the checkpointed weights, not fresh ones: p_0 * (1 - lr * wd)^2
    settings = settings_of_run(trained_run)
    initial = nnx.state(build.new_model(settings, CharTokenizer()), nnx.Param)
    factor = decay_per_step**2
    (params,) = evaluated
    for p0, p2 in zip(jax.tree.leaves(initial), jax.tree.leaves(params), strict=True):
        np.testing.assert_allclose(np.asarray(p2), factor * np.asarray(p0), **close(rtol=1e-5, atol=1e-7))


def test_eval_rejects_bad_k_and_missing_runs(trained_run, tmp_path, capsys):
    assert main(["eval", "--run", str(trained_run), "--k", "5"]) == 2  # k > the run's 4 samples
    assert "--samples" in capsys.readouterr().err
    assert main(["eval", "--run", str(tmp_path)]) == 2
    assert "config.yaml" in capsys.readouterr().err
    with pytest.raises(FileNotFoundError, match="checkpoints"):
        (tmp_path / "config.yaml").write_text((trained_run / "config.yaml").read_text())
        evaluate_run(tmp_path)


def test_samples_steps_and_ids_agree(trained_run):
    samples = [json.loads(line) for line in (trained_run / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["step"] for s in samples}) == [1, 2]
    for sample in samples:
        assert sample["id"].startswith(f"step{sample['step']}/"), sample["id"]


def test_counts_are_pluralised():
    from trainer.run import plural

    assert [plural(n, "step") for n in (0, 1, 2)] == ["0 steps", "1 step", "2 steps"]
