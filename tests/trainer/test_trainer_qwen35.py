"""A GRPO step on the committed tiny Qwen3.5 folder (the multimodal layout it ships in) through
`trainer train`: full fine-tuning, and LoRA on the linear-attention and attention projections with
an int8 base; a paged engine is refused with its reason before anything compiles."""

import json
from pathlib import Path

import pytest

from trainer.cli import main

QWEN35 = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen35"


def _argv(tmp_path: Path, *extra: str) -> list[str]:
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1?", "answer": f"#### {a + 1}"}) + "\n" for a in range(6)))
    return [
        "train", "--model", str(QWEN35), "--task", "gsm8k", "--data", str(data), "--algo", "grpo",
        "--output", str(tmp_path / "run"), "--no-progress", "training.num_steps=1", "training.prompts_per_step=2",
        "algorithm.group_size=2", "task.options.heldout_size=2", "task.options.max_new_tokens=8",
        "eval.samples_per_prompt=2", "eval.pass_k=1", "eval.every_steps=0", *extra,
    ]  # fmt: skip


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [(), ("model.lora.rank=4", "model.quantize=int8",
                                        "model.lora.targets=[q_proj, o_proj, in_proj_qkv, in_proj_z, out_proj]")],
                         ids=["full", "qlora"])
def test_a_grpo_step_on_qwen3_5(tmp_path, extra):
    assert main(_argv(tmp_path, *extra)) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["skipped_updates"] == 0


def test_the_paged_engine_is_refused_for_qwen3_5_before_the_model_loads(tmp_path, capsys):
    assert main(_argv(tmp_path, "rollout.engine=paged")) == 2
    err = capsys.readouterr().err
    assert "rollout.engine = 'paged': the paged engine keeps no recurrent state" in err and len(err.splitlines()) == 1


def test_bench_refuses_qwen3_5_rather_than_report_a_wrong_mfu(capsys):
    assert main(["bench", "--preset", "tiny", "--model", str(QWEN35)]) == 2
    err = capsys.readouterr().err
    assert "counts the FLOPs of full-attention layers only" in err and len(err.strip().splitlines()) == 1
