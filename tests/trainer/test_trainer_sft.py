"""Supervised fine-tuning on the user's rows before RL (`warm_start.data`): the targets are the reference
turns only, the cached base policy is keyed on the file's bytes, and an RL run starts from the result."""

import json

import numpy as np
import pytest
from rl_core.config import ConfigError
from rl_models.char_tokenizer import CharTokenizer
from trainer import build
from trainer.cli import main
from trainer.settings import build_settings
from trainer.tasks import DataError
from trainer.tasks.data_task import sft_set
from trainer.warmstart import sft_arrays


def conversations(path, count=20):
    rows = [{"messages": [{"role": "user", "content": f"{a % 10}+0="}, {"role": "assistant", "content": str(a % 10)}]}
            for a in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_the_targets_are_the_reference_turns_only(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"messages": [
        {"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
        {"role": "user", "content": "+3="}, {"role": "assistant", "content": "5"}]}) + "\n")
    task = sft_set(str(path), max_prompt_tokens=32, max_new_tokens=4)
    tokenizer = CharTokenizer()
    prompt = task.train[0]
    assert prompt.text == "1+1=\n\n2\n\n+3="  # the earlier turns are the prompt (plain text: no template)
    tokens, mask, targets, target_mask = sft_arrays(task, tokenizer, task.train, np.random.default_rng(0))
    # "5" and EOS are the only trained tokens; the earlier assistant turn "2" is in the prompt, out of the loss
    assert targets[0].tolist() == [*tokenizer.encode("5"), tokenizer.eos_ids[0], 0, 0]
    assert target_mask[0].tolist() == [1.0, 1.0, 0.0, 0.0]
    assert tokenizer.decode(tokens[0][mask[0] > 0].tolist()) == "1+1=\n\n2\n\n+3="


def test_rows_without_a_reference_and_the_cache_key(tmp_path):
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps({"prompt": "1+1="}) + "\n")
    with pytest.raises(DataError, match=r"bare.jsonl:1: a supervised row needs a reference"):
        sft_set(str(bare))
    with pytest.raises(ConfigError, match=r"warm_start.data: .*a supervised row needs a reference"):
        build_settings(algo="grpo", overrides=[f"warm_start.data={bare}"])
    data = conversations(tmp_path / "chat.jsonl")
    plain = build_settings(algo="grpo")
    with_data = build_settings(algo="grpo", overrides=[f"warm_start.data={data}"])
    key = build.base_policy_key(with_data)
    assert key != build.base_policy_key(plain)
    conversations(data, count=21)  # the same path, other bytes: another base policy
    assert build.base_policy_key(with_data) != key


@pytest.mark.e2e
def test_sft_on_conversations_then_rl_starts_from_it(tmp_path):
    conv = conversations(tmp_path / "chat.jsonl", count=200)
    rl = tmp_path / "rl.jsonl"
    rl.write_text("".join(json.dumps({"prompt": f"{a}+0=", "solution": str(a)}) + "\n" for a in range(10) for _ in range(3)))
    common = ["--no-progress", "training.num_steps=1", "training.prompts_per_step=4", "algorithm.group_size=2",
              "eval.every_steps=0", "eval.samples_per_prompt=1", "eval.pass_k=1", "task.options.max_new_tokens=4",
              "task.options.heldout_size=10"]
    assert main(["train", "--algo", "grpo", "--data", str(rl), "--output", str(tmp_path / "sft"), *common,
                 "warm_start.steps=30", "warm_start.batch_size=32", f"warm_start.data={conv}"]) == 0
    assert main(["train", "--algo", "grpo", "--data", str(rl), "--output", str(tmp_path / "none"), *common,
                 "warm_start.steps=0"]) == 0
    before = {name: json.loads((tmp_path / name / "eval_before.json").read_text())["eval/accuracy"]
              for name in ("sft", "none")}
    # 30 steps of imitating "a+0=" -> "a" answer all ten held-out rows; the random model none of them
    assert before == {"sft": 1.0, "none": 0.0}
