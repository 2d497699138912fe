"""The update and the log-prob passes (reference and behaviour: one program, the learner's
`logprob_fn`; trainer.plan.programs) unembed the completions in checkpointed chunks
(rl_core.policy.logprobs.chunked_logprobs): none of them ever holds the float32 [rows, tokens, vocab]
logits, which at a real vocabulary is the largest array of a step."""

from __future__ import annotations

import json

from trainer.plan import memory_budget, plan
from trainer.settings import build_settings

VOCAB, ROWS, CHUNK = 65_536, 8, 16


def _temporaries(folder, tokens: int) -> tuple[int, int]:
    settings = build_settings(algo="grpo", overrides=[
        f"model.path={folder}", "training.prompts_per_step=2", "algorithm.group_size=4", "algorithm.beta=0.04",
        f"rollout.max_new_tokens={tokens}", f"rollout.logprob_chunk_tokens={CHUNK}", "model.remat=none",
        "training.micro_batch_size=null", "rollout.engine=static"])
    compiled = plan(settings, memory_budget("cpu")).compiled
    return compiled["update_temporaries"], compiled["reference_temporaries"]


def test_no_program_holds_the_whole_float32_logits(tmp_path):
    """A one-layer Qwen2 of width 64 with a 65,536-token vocabulary, 2 prompts x 4 completions, beta > 0 (the
    reference pass is compiled). The whole logits of 256 tokens are 8 x 256 x 65,536 x 4 B = 512 MiB, and
    another 512 MiB at 512 tokens; a chunk of 16 tokens is 32 MiB whatever the length. So from 256 to 512
    tokens a program holding the whole logits grows by at least 512 MiB; chunked, only by its activations
    (width 64) and attention probabilities (8 rows x 4 heads x under 540^2 x 4 B = 36 MiB)."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": VOCAB,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": True, "max_position_embeddings": 4096}))
    whole = ROWS * 256 * VOCAB * 4
    assert whole == 512 * 2**20
    (update, reference), (update_2x, reference_2x) = _temporaries(tmp_path, 256), _temporaries(tmp_path, 512)
    assert update < whole / 2 and reference < whole / 4, (update / 2**20, reference / 2**20)
    assert update_2x - update < whole / 4, (update / 2**20, update_2x / 2**20)
    assert reference_2x - reference < whole / 4, (reference / 2**20, reference_2x / 2**20)
