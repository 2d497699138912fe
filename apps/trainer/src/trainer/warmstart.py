"""Supervised warm start: imitate the task's reference completions for a few hundred steps.

RL needs a base policy that is right sometimes but not always; a short run of
next-token cross-entropy on (prompt, reference + EOS) pairs gives one, from
the same seed every time.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from rl_core.data import Prompt
from rl_core.logprobs import completion_logprobs
from rl_core.progress import ProgressBar
from rl_core.tokens import Tokenizer, encode_prompts

from trainer.tasks import Task


def sft_arrays(
    task: Task, tokenizer: Tokenizer, prompts: Sequence[Prompt], rng: np.random.Generator
) -> tuple[np.ndarray, ...]:
    """(prompt tokens, prompt mask, target tokens, target mask) with targets right-padded."""
    prompt_tokens, prompt_mask = encode_prompts(tokenizer, [p.text for p in prompts], max_tokens=task.max_prompt_tokens)
    width = task.max_new_tokens
    targets = np.full((len(prompts), width), tokenizer.pad_id, np.int32)
    target_mask = np.zeros((len(prompts), width), np.float32)
    for i, p in enumerate(prompts):
        seq = tokenizer.encode(task.teacher(p, rng)) + [tokenizer.eos_ids[0]]
        if len(seq) > width:
            raise ValueError(f"reference completion of prompt {p.text!r} has {len(seq)} tokens > {width}")
        targets[i, : len(seq)] = seq
        target_mask[i, : len(seq)] = 1.0
    return prompt_tokens, prompt_mask, targets, target_mask


def warm_start(
    model: nnx.Module,
    task: Task,
    tokenizer: Tokenizer,
    *,
    steps: int,
    batch_size: int = 64,
    learning_rate: float = 3e-3,
    seed: int = 0,
    progress: bool = False,
) -> nnx.Module:
    """Train `model` in place by cross-entropy on reference completions; returns it.

    With `progress`, a bar (or plain lines when the output is not a terminal) shows the steps and the loss.
    """
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)  # plain arrays: cheaper to pass through jit than Variables
    tx = optax.adam(learning_rate)
    opt_state = tx.init(params)
    rng = np.random.default_rng(seed)
    arrays = sft_arrays(task, tokenizer, task.train, rng)

    @jax.jit
    def step(params, opt_state, batch):
        def loss_fn(p):
            logp, _ = completion_logprobs(nnx.merge(graphdef, p), batch[0], batch[1], batch[2])
            return -jnp.sum(logp * batch[3]) / jnp.sum(batch[3])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    with ProgressBar(steps, enabled=progress, description="warm start") as bar:
        bar.update(0, {})
        for i in range(steps):
            rows = rng.integers(0, len(task.train), batch_size)
            params, opt_state, loss = step(params, opt_state, tuple(jnp.asarray(a[rows]) for a in arrays))
            if progress and ((i + 1) % 20 == 0 or i + 1 == steps):  # reading the loss waits for the step
                bar.update(i + 1, {"loss": float(loss)})
    nnx.update(model, params)
    return model
