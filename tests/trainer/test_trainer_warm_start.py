"""The warm start shows its progress and its loss."""

import math
import re

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
