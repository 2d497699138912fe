"""The warm start shows its progress and its loss."""

import math
import re

import pytest

from flax import nnx

from rl_models import CharTokenizer, Transformer, preset
from trainer.tasks import arithmetic
from trainer.warmstart import warm_start


def test_warm_start_prints_progress_lines_with_the_loss_when_not_a_terminal(capsys):
    tokenizer = CharTokenizer()
    model = Transformer(preset("tiny", vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(0))
    warm_start(model, arithmetic(), tokenizer, steps=40, batch_size=8, progress=True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warm start:")]
    # loss read every 20 steps; pytest's captured stdout is not a terminal: plain lines
    assert [line.split("  ")[0] for line in lines] == ["warm start: step 20/40 (50%)", "warm start: step 40/40 (100%)"]
    losses = [float(re.search(r"loss (\d+\.\d+)", line).group(1)) for line in lines]
    # below the cross-entropy of a uniform guess over the vocabulary, ln(99) = 4.595: it learned
    assert all(loss < math.log(tokenizer.vocab_size) - 1.0 for loss in losses), losses
    assert all("eta " in line for line in lines)


def test_the_cached_base_policy_is_keyed_by_the_device_layout():
    """A base warm-started on 2 devices ends elsewhere than one on 1 device (the sums are split
    over the mesh): the cache folder's key tells them apart, so neither reuses the other's."""
    import jax

    from trainer.build import base_policy_key
    from trainer.settings import build_settings

    settings = build_settings(algo="grpo")
    here = base_policy_key(settings)
    assert here == base_policy_key(settings, devices=jax.device_count())
    assert here != base_policy_key(settings, devices=2 * jax.device_count())
    # settings that do not touch the base still share it (LoRA runs and full runs, another RL algorithm)
    assert base_policy_key(build_settings(algo="dapo", overrides=["model.lora.rank=4"])) == here


@pytest.mark.e2e
def test_train_reuses_an_identical_base_policy_cached_by_an_earlier_run(tmp_path, capsys, monkeypatch):
    """`trainer compare` caches its base in runs/compare; a later `trainer train` with the same
    warm start, model, task and layout copies it (--base-from, default runs/compare) instead of
    repeating the warm start; other warm-start settings warm-start anew."""
    from trainer import build
    from trainer.cli import main

    small = ["--no-progress", "warm_start.steps=2", "warm_start.batch_size=4", "training.num_steps=1",
             "training.prompts_per_step=2", "algorithm.group_size=2", "eval.heldout_size=2",
             "eval.samples_per_prompt=1", "eval.pass_k=1", "eval.every_steps=0", "task.options.digits=1",
             "task.options.heldout_size=5"]  # fmt: skip
    earlier = tmp_path / "compare"
    assert main(["train", "--algo", "grpo", "--output", str(earlier), *small]) == 0
    cached = sorted(p.name for p in earlier.glob("base-policy-*"))
    assert len(cached) == 1
    capsys.readouterr()

    def no_warm_start(*args, **kwargs):
        raise AssertionError("warm-started although an identical base policy was cached")

    monkeypatch.setattr(build, "warm_start", no_warm_start)
    run = tmp_path / "run"
    assert main(["train", "--algo", "dapo", "--output", str(run), "--base-from", str(earlier), *small]) == 0
    assert f"base policy: the identical one cached in {earlier}" in capsys.readouterr().out
    assert sorted(p.name for p in run.glob("base-policy-*")) == cached  # the run folder holds its own copy
    # another warm start is not that base: it warm-starts (here, reaches the patched warm start)
    with pytest.raises(AssertionError, match="warm-started although"):
        main(["train", "--algo", "grpo", "--output", str(tmp_path / "other"), "--base-from", str(earlier),
              *small, "warm_start.learning_rate=1e-3"])
