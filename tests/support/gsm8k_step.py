"""The argv of a one-step GRPO `trainer train` on a Hugging Face folder and six tiny GSM8K-format
rows: how the model-family tests take a training step end to end."""

import json
from pathlib import Path


def one_step_argv(model: Path, tmp_path: Path, *extra: str) -> list[str]:
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1?", "answer": f"#### {a + 1}"}) + "\n" for a in range(6)))
    return [
        "train", "--model", str(model), "--task", "gsm8k", "--data", str(data), "--algo", "grpo",
        "--output", str(tmp_path / "run"), "--no-progress", "training.num_steps=1", "training.prompts_per_step=2",
        "algorithm.group_size=2", "task.options.heldout_size=2", "task.options.max_new_tokens=8",
        "eval.samples_per_prompt=2", "eval.pass_k=1", "eval.every_steps=0", *extra,
    ]  # fmt: skip
