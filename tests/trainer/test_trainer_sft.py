"""Supervised fine-tuning on the user's rows before RL (`warm_start.data`): the targets are the reference
turns only, the cached base policy is keyed on the file's bytes, and an RL run starts from the result."""

import json

import numpy as np
import pytest
from rl_core.config import ConfigError
from rl_models.char_tokenizer import CharTokenizer
from pathlib import Path

from rl_models.hf import load_hf_tokenizer
from trainer import build
from trainer.cli import main
from trainer.settings import build_settings
from trainer.tasks import DataError
from trainer.tasks.data_task import sft_set
from trainer.warmstart import sft_arrays

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def conversations(path, count=20):
    rows = [{"messages": [{"role": "user", "content": f"{a % 10}+0="}, {"role": "assistant", "content": str(a % 10)}]}
            for a in range(count)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def two_turns(path):
    path.write_text(json.dumps({"messages": [
        {"role": "user", "content": "1+1="}, {"role": "assistant", "content": "2"},
        {"role": "user", "content": "+3="}, {"role": "assistant", "content": "5"}]}) + "\n")
    return path


def test_every_assistant_turn_is_trained_and_nothing_else(tmp_path):
    path = two_turns(tmp_path / "chat.jsonl")
    settings = build_settings(algo="grpo", overrides=[f"warm_start.data={path}", "rollout.max_new_tokens=12"])
    tokenizer = CharTokenizer()
    task = build.warm_start_task(settings, None, tokenizer)  # no template: plain text
    prompt = task.train[0]
    assert prompt.text == "1+1="  # the prompt ends before the first assistant turn
    assert prompt.fields["segments"] == (("\n\n", False), ("2", True), ("\n\n+3=", False), ("5", True))
    tokens, mask, targets, target_mask = sft_arrays(task, tokenizer, task.train, np.random.default_rng(0))
    n = len("\n\n2\n\n+3=5") + 1
    assert targets[0, :n].tolist() == [*tokenizer.encode("\n\n2\n\n+3=5"), tokenizer.eos_ids[0]]
    # trained: "2", "5" and EOS; the separators and the user's turn are in the sequence, out of the loss
    assert target_mask[0, :n].tolist() == [0, 0, 1, 0, 0, 0, 0, 0, 1, 1]
    assert target_mask[0, n:].sum() == 0
    assert tokenizer.decode(tokens[0][mask[0] > 0].tolist()) == "1+1="


def test_with_a_chat_template_each_turn_is_cut_where_the_template_puts_it(tmp_path):
    path = two_turns(tmp_path / "chat.jsonl")
    settings = build_settings(algo="grpo", overrides=[f"warm_start.data={path}", f"model.path={FIXTURES / 'qwen2'}"])
    task = build.warm_start_task(settings, None, load_hf_tokenizer(FIXTURES / "qwen2"))
    assert task.train[0].text.endswith("<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n")
    assert task.train[0].fields["segments"] == (
        ("2<|im_end|>\n", True),  # the reply and its end-of-turn marker: the model learns to end its turn
        ("<|im_start|>user\n+3=<|im_end|>\n<|im_start|>assistant\n", False),
        ("5", True),  # the final reply, then EOS
    )


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
