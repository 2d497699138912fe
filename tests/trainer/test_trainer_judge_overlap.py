"""A judge served by the paged engine under overlapping scorings (training.max_staleness >= 2): k = 4
scoring threads calling one JudgeReward at once get the serial scores and counters; without the
judge's lock two threads drove one engine and crashed it ('page released more often than held')."""

import threading

import pytest
from flax import nnx
from rewards import RewardManager, RewardSpec
from rl_models import PAGED_TRANSFORMER, Transformer, preset
from rl_models.char_tokenizer import CharTokenizer

from trainer.judge.model import JudgeModel
from trainer.judge.reward import JudgeReward
from trainer.settings.judge import JudgeSettings

pytestmark = pytest.mark.e2e
K = 4


def test_four_overlapping_scorings_of_a_paged_judge_equal_the_serial_ones():
    tokenizer = CharTokenizer()
    module = Transformer(preset("tiny", vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(0))
    settings = JudgeSettings(template="{prompt}{completion}?", verdict="yes_no", max_prompt_tokens=32,
                             max_new_tokens=6, engine="paged")
    judge = JudgeModel(module, tokenizer, max_prompt_tokens=32, max_new_tokens=6, engine="paged",
                       paging=PAGED_TRANSFORMER)
    manager = RewardManager([RewardSpec(JudgeReward(judge, settings), name=settings.name)])
    batches = [([f"{n}+{i}=" for i in range(2 + n)], [str(n + i) for i in range(2 + n)]) for n in range(K)]
    serial = [manager.score(*batch) for batch in batches]
    start, results, errors = threading.Barrier(K, timeout=60), [None] * K, []

    def score(i):
        start.wait()
        try:
            results[i] = manager.score(*batches[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=score, args=(i,)) for i in range(K)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert errors == []
    for one, other in zip(serial, results):
        assert other.total == one.total
        assert other.function_metrics[f"rewards/{settings.name}/unparsed"] == \
            one.function_metrics[f"rewards/{settings.name}/unparsed"]
