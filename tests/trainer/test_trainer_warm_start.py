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
