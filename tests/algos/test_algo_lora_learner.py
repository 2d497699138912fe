"""GRPO with LoRA adapters: only they train, the base is never touched, the reference
policy is the base itself, and checkpoints hold the adapters with an exact resume.

The policy is the tiny Transformer (D=64, 2 layers) with rank-4 adapters on every
projection: 4 * 8192 / 8 * 2 layers = 8,192 trainable parameters (see
tests/rl_models/test_models_lora.py for the analytic count per projection).
"""

import functools
import shutil

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import rewards
from algo_grpo import GRPOConfig, GRPOLearner
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.policy.logprobs import completion_logprobs
from rl_core.train.trainable import TrainableModel
from rl_models import CharTokenizer, Transformer, TransformerConfig
from rl_models.lora import add_adapters, quantize_base
from tolerances import close

TOK = CharTokenizer()
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 7) for b in range(1, 7)]
RANK4_COUNT = 8_192  # rank 4: half of rank 8's 16,384


def digit_fraction(prompts, completions, **_):
    """Shaping reward that varies even for an untrained policy (so every step has a gradient)."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


def base_model() -> Transformer:
    return Transformer(TransformerConfig.tiny(TOK.vocab_size), rngs=nnx.Rngs(0))


class RecordingGRPO(GRPOLearner):
    """Records, at every step, the reference log-probs and the base's own log-probs of the
    same completions (from a plain copy of the base, without adapters)."""

    def __init__(self, *args, base: Transformer, **kwargs):
        super().__init__(*args, **kwargs)
        # the plain base as a model of its own (never trained), so that its log-prob pass is
        # the learner's program on other parameters
        self.base = TrainableModel(base, name="base", optimizer=optax.sgd(0.0), loss=self._loss_function,
                                   layout=self.layout)
        chunk = self.rollout.logprob_chunk_tokens
        fn = functools.partial(completion_logprobs, temperature=self.rollout.temperature, chunk_tokens=chunk)
        self._base_logprobs = self.base.forward(fn, chunk_tokens=chunk, shares=True)  # as the learner's pass
        self._base_params = self.base.init_state(base).params
        self.records: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def _reference_logprobs(self, example):
        ref = super()._reference_logprobs(example)
        base, _ = self._base_logprobs(self._base_params, example.prompt_tokens, example.prompt_mask, example.completion_tokens,
                                      mask=example.completion_mask)
        policy, _ = self._logprob_pass(self.params, example)
        self.records.append(tuple(np.asarray(x) for x in (ref, base, policy)))
        return ref


def make_learner(policy, *, cls=GRPOLearner, output_dir=None, beta=0.04, **kwargs):
    return cls(
        GRPOConfig(group_size=4, beta=beta),
        policy=policy,
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(optimizer="adamw", learning_rate=1e-2, prompts_per_step=4, num_steps=3,
                                checkpoint_every_steps=0),
        rollout=RolloutConfig(max_prompt_tokens=8, max_new_tokens=6, temperature=1.0, seed=0),
        reward_manager=rewards.RewardManager([rewards.numeric_answer_reward(), digit_fraction]),
        output_dir=output_dir,
        **kwargs,
    )


def numpy_tree(tree):
    return jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(tree))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Three GRPO steps (beta 0.04) with adapters; checkpoints after steps 2 and 3."""
    folder = tmp_path_factory.mktemp("lora") / "run"
    policy = add_adapters(base_model(), rank=4, alpha=8.0)
    base_before = numpy_tree(nnx.to_pure_dict(nnx.state(policy, nnx.LoRAParam, nnx.Param)[1]))
    adapters_before = numpy_tree(nnx.to_pure_dict(nnx.state(policy, nnx.LoRAParam)))
    learner = make_learner(policy, cls=RecordingGRPO, base=base_model(), output_dir=folder)
    opt_sizes = sum(x.size for x in jax.tree.leaves(learner.state.policy.opt_state))
    learner.train(2)
    after_two = numpy_tree(learner.params)
    learner.train(3)
    learner.close()
    return {
        "folder": folder, "learner": learner, "base_before": base_before, "adapters_before": adapters_before,
        "opt_sizes": opt_sizes, "after_two": after_two, "after_three": numpy_tree(learner.params),
    }


def test_only_the_adapters_train_and_have_optimizer_state(run):
    learner = run["learner"]
    assert sum(x.size for x in jax.tree.leaves(learner.params)) == RANK4_COUNT
    # AdamW: two moments per adapter entry, plus scalar counters
    assert 2 * RANK4_COUNT <= run["opt_sizes"] <= 2 * RANK4_COUNT + 8
    assert all(set(lin) == {"lora_a", "lora_b"} for lin in learner.params["layers"]["attn"].values())


def test_every_base_weight_is_bit_identical_after_training_and_the_adapters_moved(run):
    learner = run["learner"]
    frozen = numpy_tree(learner.policy.frozen)
    flat_before = jax.tree_util.tree_leaves_with_path(run["base_before"])
    flat_after = dict(jax.tree_util.tree_leaves_with_path(frozen))
    assert len(flat_before) == len(flat_after) == 12  # embed, lm_head, final norm; stacked: 2 norms, 7 kernels
    for path, before in flat_before:
        np.testing.assert_array_equal(flat_after[path], before, err_msg=jax.tree_util.keystr(path))
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), run["after_three"], run["adapters_before"])
    assert all(v > 0 for v in jax.tree.leaves(moved))  # every A and B moved


def test_reference_is_the_base_at_every_step_and_fresh_adapters_give_the_base(run):
    learner = run["learner"]
    records = learner.records
    assert len(records) == 3  # one reference pass per step
    # the reference is all-zero adapters over the shared base: no copy of the base weights
    assert sum(x.size for x in jax.tree.leaves(learner._ref_params)) == RANK4_COUNT
    assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(learner._ref_params))
    # zero adapters over the base against the plain base (another program): bit for bit on the CPU,
    # XLA:TPU may sum the zero branch in another order
    for step, (ref, base, policy) in enumerate(records):
        np.testing.assert_allclose(ref, base, **close(rtol=0, atol=1e-9), err_msg=f"step {step + 1}")
    # B = 0 at step 1: the policy is the base
    np.testing.assert_allclose(records[0][2], records[0][1], **close(rtol=0, atol=1e-9))
    assert not np.array_equal(records[2][2], records[2][1])  # by step 3 the adapters act


def test_checkpoints_hold_the_adapters_and_resume_is_exact(run, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(run["folder"], folder)
    shutil.rmtree(folder / "checkpoints" / "3")  # as if killed after step 2's checkpoint
    learner = make_learner(add_adapters(base_model(), rank=4, alpha=8.0), cls=RecordingGRPO, base=base_model(),
                           output_dir=folder)
    assert learner.resume(log=lambda _: None) and learner.step == 2
    restored = numpy_tree(learner.params)
    assert sum(x.size for x in jax.tree.leaves(restored)) == RANK4_COUNT  # adapters only, no base
    jax.tree.map(np.testing.assert_array_equal, restored, run["after_two"])
    learner.train(3)
    learner.close()
    jax.tree.map(np.testing.assert_array_equal, numpy_tree(learner.params), run["after_three"])


# nf4, QLoRA's own format, in the fast tier; int8 in the e2e tier
@pytest.mark.parametrize("qtype", [pytest.param("int8", marks=pytest.mark.e2e), "nf4"])
def test_qlora_trains_without_non_finite_updates(qtype):
    policy = add_adapters(quantize_base(base_model(), qtype), rank=4, alpha=8.0)
    codes = np.array(policy.layers.mlp.up_proj.kernel[...])
    learner = make_learner(policy, beta=0.04)
    history = [learner.train_step() for _ in range(2)]
    assert learner.state.updates.skipped == 0
    assert all(np.isfinite(h["train/loss"]) and np.isfinite(h["train/grad_norm"]) for h in history)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(jax.device_get(learner.params)))
    assert float(np.abs(learner.params["layers"]["mlp"]["up_proj"]["lora_b"]).max()) > 0
    np.testing.assert_array_equal(np.asarray(learner.policy.frozen["layers"]["mlp"]["up_proj"]["kernel"]), codes)
