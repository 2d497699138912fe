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
from tolerances import approx, close

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
                 "warm_start.steps=30", "warm_start.batch_size=32", f"warm_start.data={conv}",
                 "warm_start.row_tokens=64"]) == 0
    assert main(["train", "--algo", "grpo", "--data", str(rl), "--output", str(tmp_path / "none"), *common,
                 "warm_start.steps=0"]) == 0
    before = {name: json.loads((tmp_path / name / "eval_before.json").read_text())["eval/accuracy"]
              for name in ("sft", "none")}
    # 30 steps of imitating "a+0=" -> "a" answer all ten held-out rows; the random model none of them
    assert before == {"sft": 1.0, "none": 0.0}
    # the warm start's own metrics file, packed by default with warm_start.data: 32 sequences of 7 tokens
    # (BOS "a+0=" "a" EOS) a step, 9 to a row of 64 tokens: 4 rows where unpacked 32
    from trainer.warmstart import SFT_METRIC_KEYS

    records = [json.loads(line) for line in (tmp_path / "sft" / "sft_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 31))
    assert all(tuple(r) == SFT_METRIC_KEYS and r["rows"] == 4.0 and r["row_tokens"] == 64.0
               and r["tokens"] == 64.0 and r["padding_frac"] == approx(1 - 32 * 7 / (4 * 64)) for r in records)
    assert records[-1]["loss"] < records[0]["loss"]
    assert not (tmp_path / "none" / "sft_metrics.jsonl").exists()  # no warm start, no file
    from rich.console import Console

    from trainer.show import show_run

    console = Console(record=True, width=200)
    show_run(tmp_path / "sft", console=console, plots=False)
    [line] = [line for line in console.export_text().splitlines() if line.startswith("supervised warm start:")]
    assert line.startswith("supervised warm start: 30 steps, loss ") and "4.0 rows of 64 tokens a step (12% padding)" in line


def mixed_lengths(path, count=16):
    """Conversations of one or two exchanges: sequences of unlike lengths, as packing meets them."""
    rows = []
    for a in range(count):
        turns = [{"role": "user", "content": f"{a % 10}+0="}, {"role": "assistant", "content": str(a % 10)}]
        for _ in range(a % 2):
            turns += [{"role": "user", "content": "+1="}, {"role": "assistant", "content": "x"}]
        rows.append({"messages": turns})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft_records(tmp_path, name, packing, steps=3, **kwargs):
    """`steps` supervised steps of the tiny model on the mixed conversations; (its params, the metrics records)."""
    import jax
    from flax import nnx
    from rl_models import Transformer, preset

    from trainer.warmstart import warm_start

    data = mixed_lengths(tmp_path / "mixed.jsonl")
    settings = build_settings(algo="grpo", overrides=[f"warm_start.data={data}", "rollout.max_new_tokens=24",
                                                      "rollout.max_prompt_tokens=8"])
    tokenizer = CharTokenizer()
    task = build.warm_start_task(settings, None, tokenizer)
    model = Transformer(preset("tiny", vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(0))
    path = tmp_path / f"{name}.jsonl"
    warm_start(model, task, tokenizer, steps=steps, batch_size=8, learning_rate=1e-2, packing=packing,
               metrics_path=path, log=lambda _: None, **kwargs)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return jax.tree.leaves(nnx.to_pure_dict(nnx.state(model))), records


@pytest.mark.e2e  # two warm starts compiled (about 4 s on 2 cores)
def test_packed_sft_gives_the_unpacked_loss_on_fewer_rows(tmp_path):
    """The same 8 sequences a step, packed into rows of P + T = 8 + 24 tokens: each token keeps its log-prob
    (positions restart, attention stops at each sequence), so the loss and the update are the unpacked
    ones; the rows computed drop from 8 to at most 4 (any two sequences fit in a row)."""
    unpacked_params, unpacked = sft_records(tmp_path, "unpacked", packing=False)
    packed_params, packed = sft_records(tmp_path, "packed", packing=True)
    from trainer.warmstart import SFT_METRIC_KEYS

    assert [tuple(r) for r in packed] == [SFT_METRIC_KEYS] * 3
    assert [r["step"] for r in packed] == [r["step"] for r in unpacked] == [1, 2, 3]
    for u, p in zip(unpacked, packed, strict=True):
        assert p["loss"] == approx(u["loss"], abs=1e-5)
        assert p["tokens"] == u["tokens"]  # the trained tokens: the same rows were drawn
        assert (u["rows"], u["row_tokens"]) == (8.0, 32.0)
        assert p["rows"] <= 4.0 and p["row_tokens"] == 32.0
        # the same tokens on half the positions or fewer: 1 - padding doubles at least
        assert 1 - p["padding_frac"] == approx((1 - u["padding_frac"]) * 8 / p["rows"])
    # a sequence is BOS + "a+0=" (5 prompt tokens), then "a" + EOS or "\n\na\n\n+1=x" + EOS (2 or 10 tokens):
    # 7 or 15 of a row's 32 unpacked; trained: the replies' characters and EOS (2 or 3 a sequence)
    assert all(16.0 <= u["tokens"] <= 24.0 and 1 - 15 / 32 <= u["padding_frac"] <= 1 - 7 / 32 for u in unpacked)
    # the loss of steps 2 and 3 is the same after two updates: so were the updates


@pytest.mark.e2e  # three gradients of the tiny model traced (about 6 s on 2 cores)
def test_the_packed_loss_and_its_gradients_are_the_unpacked_ones(tmp_path):
    """On one batch of the mixed conversations, directly: the same loss and gradients, packed or not; with the
    segments ignored (attention across sequences) the loss would differ."""
    import jax
    from flax import nnx
    from rl_core.train.packing import pack
    from rl_models import Transformer, preset

    from trainer.warmstart import sft_loss

    data = mixed_lengths(tmp_path / "mixed.jsonl")
    settings = build_settings(algo="grpo", overrides=[f"warm_start.data={data}", "rollout.max_new_tokens=24",
                                                      "rollout.max_prompt_tokens=8"])
    tokenizer = CharTokenizer()
    task = build.warm_start_task(settings, None, tokenizer)
    batch = sft_arrays(task, tokenizer, task.train[:8], np.random.default_rng(0))
    packed = pack(*batch)
    assert packed.tokens.shape == (3, 32)  # 8 sequences of 7 or 15 tokens: three rows of 32
    model = Transformer(preset("tiny", vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(model)

    def loss_and_grads(p):
        return jax.value_and_grad(lambda q: sft_loss(nnx.merge(graphdef, q), batch, p))(params)

    (loss, grads), (packed_loss, packed_grads) = loss_and_grads(None), loss_and_grads(packed)
    assert float(packed_loss) == approx(float(loss), abs=1e-5)
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(packed_grads), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **close(atol=1e-5))
    crossing = packed._replace(segments=np.where(packed.segments > 0, 1, 0).astype(np.int32))  # one segment a row
    assert abs(float(sft_loss(model, batch, crossing)) - float(loss)) > 1e-3


def test_a_packed_sft_killed_between_checkpoints_continues_exactly(tmp_path, monkeypatch):
    """Killed (a full disk's error) at step 5 of 6, after its checkpoint at step 3: the next call
    continues from step 3, and the params and the metrics file (each step once) equal one uninterrupted run."""
    from rl_core.run.faults import ENV

    for folder in ("straight", "killed"):
        (tmp_path / folder).mkdir()
    straight_params, straight = sft_records(tmp_path / "straight", "m", packing=True, steps=6,
                                            checkpoint_dir=tmp_path / "straight" / "ck", checkpoint_every_steps=3)
    monkeypatch.setenv(ENV, "enospc@warm_start:5")
    with pytest.raises(OSError, match="No space left"):
        sft_records(tmp_path / "killed", "m", packing=True, steps=6, checkpoint_dir=tmp_path / "killed" / "ck",
                    checkpoint_every_steps=3)
    monkeypatch.delenv(ENV)
    params, records = sft_records(tmp_path / "killed", "m", packing=True, steps=6,
                                  checkpoint_dir=tmp_path / "killed" / "ck", checkpoint_every_steps=3)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in records] == [r["loss"] for r in straight]
    for a, b in zip(straight_params, params, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
