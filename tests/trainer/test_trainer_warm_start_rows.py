"""The warm start on rows of your own (`--data`): lengths from the rows, not 256 + 256; half of the
training rows imitated by the warm start and kept apart from the RL prompts (a warm start that
memorised the RL prompts' answers left every group uniform)."""

import json

import pytest
from rl_core.config import ConfigError
from rl_models.char_tokenizer import CharTokenizer
from trainer import build
from trainer.run.train import load_task
from trainer.settings import build_settings
from trainer.tasks import data, sized_lengths, split_for_warm_start


def sums(path, n=20):
    """n sums a+b= (a = 0..n-1, b = 7): prompts of 4 or 5 characters, answers of 1 or 2."""
    path.write_text("".join(json.dumps({"prompt": f"{a}+7=", "solution": str(a + 7)}) + "\n" for a in range(n)))
    return str(path)


def test_the_lengths_come_from_the_rows_without_a_model_folder(tmp_path):
    settings = build_settings(algo="grpo", overrides=[f"task.options.data={sums(tmp_path / 's.jsonl')}"])
    # "19+7=" is 5 characters + BOS; "26" is 2 + EOS + 2 of slack (a quarter, at least 2)
    assert (settings.rollout.max_prompt_tokens, settings.rollout.max_new_tokens) == (6, 5)
    set_one = build_settings(algo="grpo", overrides=[f"task.options.data={tmp_path / 's.jsonl'}",
                                                     "task.options.max_new_tokens=9"])
    assert (set_one.rollout.max_prompt_tokens, set_one.rollout.max_new_tokens) == (6, 9)


def test_the_lengths_hold_the_warm_starts_own_rows_too(tmp_path):
    (tmp_path / "sft.jsonl").write_text(json.dumps({"messages": [
        {"role": "user", "content": "Spell 19+7 in words:"}, {"role": "assistant", "content": "twenty-six"}]}) + "\n")
    settings = build_settings(algo="grpo", overrides=[f"task.options.data={sums(tmp_path / 's.jsonl')}",
                                                      f"warm_start.data={tmp_path / 'sft.jsonl'}"])
    # its prompt: 20 characters + BOS; its reply: 10 + EOS + 2, beyond the sums' 6 and 5
    assert (settings.rollout.max_prompt_tokens, settings.rollout.max_new_tokens) == (21, 13)


def test_a_model_folders_tokenizer_keeps_the_default_lengths(tmp_path):
    task = data(data=sums(tmp_path / "s.jsonl"), heldout_size=2)
    assert task.row_lengths == (6, 5) and (task.max_prompt_tokens, task.max_new_tokens) == (256, 256)
    assert sized_lengths(task, None) == {"max_prompt_tokens": 6, "max_new_tokens": 5}
    assert sized_lengths(task, "models/qwen") == {}  # its tokens are not characters: the defaults stay
    boxed = [{"prompt": "Capital?", "solution": "Paris" * 8}, {"prompt": "x", "solution": "y"}]
    (tmp_path / "w.jsonl").write_text("".join(json.dumps(r) + "\n" for r in boxed))
    # \boxed{...} around 40 characters is 48, + EOS + 12 (a quarter of 48)
    assert data(data=str(tmp_path / "w.jsonl"), heldout_size=1).row_lengths == (9, 61)


def test_the_warm_start_imitates_rows_kept_apart_from_the_rl_prompts(tmp_path):
    settings = build_settings(algo="grpo", overrides=[f"task.options.data={sums(tmp_path / 's.jsonl')}",
                                                      "task.options.heldout_size=4"])
    lines = []
    task = load_task(settings, CharTokenizer(), lines.append)
    warm = build.warm_start_task(settings, task, CharTokenizer())
    rl_prompts, imitated = {p.text for p in task.train}, {p.text for p in warm.train}
    assert (len(imitated), len(rl_prompts)) == (8, 8) and not imitated & rl_prompts  # 16 training rows, halved
    assert len(rl_prompts | imitated | {p.text for p in task.heldout}) == 20
    assert warm.max_new_tokens == 5  # its targets as wide as the run's completions, not 256
    assert lines == [
        "task data: lengths from the rows (the character tokenizer's tokens are their characters): max_prompt_tokens 6 "
        "(rollout.max_prompt_tokens=6), max_new_tokens 5 (rollout.max_new_tokens=5); task.options.<length>=N sets one",
        "task data: the warm start imitates 8 training rows, kept apart from RL's 8 prompts (warm_start.share=0.5; "
        "1 gives both every row)",
    ]
    for share, imitated_rows in (("0.25", 4), ("1", 16)):
        shared = build_settings(algo="grpo", overrides=[f"task.options.data={tmp_path / 's.jsonl'}",
                                                        "task.options.heldout_size=4", f"warm_start.share={share}"])
        assert len(build.warm_start_task(shared, load_task(shared, CharTokenizer(), print), CharTokenizer()).train) \
            == imitated_rows
    no_warm_start = build_settings(algo="grpo", overrides=[f"task.options.data={tmp_path / 's.jsonl'}",
                                                           "task.options.heldout_size=4", "warm_start.steps=0"])
    assert len(load_task(no_warm_start, CharTokenizer(), print).train) == 16  # RL gets every row


def test_generated_tasks_give_the_warm_start_every_row():
    settings = build_settings(algo="grpo", overrides=["task.options.heldout_size=100"])
    task = load_task(settings, CharTokenizer(), print)
    assert len(task.train) == 9900 and task.warm_start_rows == ()
    assert build.warm_start_task(settings, task, CharTokenizer()) is task


def test_split_for_warm_start_keeps_a_row_on_each_side(tmp_path):
    task = data(data=sums(tmp_path / "s.jsonl", n=4), heldout_size=1)  # 3 training rows
    assert [len(split_for_warm_start(task, s).warm_start_rows) for s in (0.01, 0.5, 0.99)] == [1, 2, 2]
    assert split_for_warm_start(task, 1.0) is task
    one = data(data=sums(tmp_path / "two.jsonl", n=2), heldout_size=1)
    with pytest.raises(ConfigError, match=r"has 1 training row, too few .* warm_start.share=1"):
        split_for_warm_start(one, 0.5)


@pytest.mark.parametrize(("override", "message"), [
    ("warm_start.share=0", r"WarmStartSettings.share = 0.0: must be in \(0, 1\] or null"),
    ("warm_start.share=1.5", r"WarmStartSettings.share = 1.5: must be in \(0, 1\] or null"),
])
def test_a_share_outside_zero_to_one_is_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        build_settings(algo="grpo", overrides=[override])


def test_a_share_with_warm_start_data_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"share = 0.5: splits the task's own rows; with warm_start.data"):
        build_settings(algo="grpo", overrides=[f"warm_start.data={sums(tmp_path / 's.jsonl')}", "warm_start.share=0.5"])
