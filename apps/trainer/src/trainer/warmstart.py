"""Supervised warm start: imitate the task's reference completions for a few hundred steps.

RL needs a base policy that is right sometimes but not always; a short run of
next-token cross-entropy on (prompt, reference + EOS) pairs gives one, from
the same seed every time.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from rl_core.run.checkpoint import remove_unfinished_saves
from rl_core.config import ConfigError
from rl_core.data import Prompt
from rl_core.registry import environment_factory
from rl_core.episodes.scripted import scripted_episode
from rl_core.run.faults import fault_point
from rl_core.policy.logprobs import completion_logprobs
from rl_core.run.progress import ProgressBar
from rl_core.policy.tokens import Tokenizer, encode_prompts

from trainer.tasks import Task


def sft_arrays(
    task: Task, tokenizer: Tokenizer, prompts: Sequence[Prompt], rng: np.random.Generator
) -> tuple[np.ndarray, ...]:
    """(prompt tokens, prompt mask, target tokens, target mask) with targets right-padded.

    A multi-turn task's target is the whole episode of the teacher's turns, the environment's
    observations included but masked out of the loss (as in RL)."""
    width = task.max_new_tokens
    targets = np.full((len(prompts), width), tokenizer.pad_id, np.int32)
    target_mask = np.zeros((len(prompts), width), np.float32)
    texts = []
    make_env = environment_factory(task.environment, task.environment_options) if task.environment else None
    for i, p in enumerate(prompts):
        if "segments" in p.fields:  # a conversation: its assistant turns trained, the turns between them not
            text, seq, mask = p.text, [], []
            for piece, trained in p.fields["segments"]:
                ids = tokenizer.encode(piece)
                seq, mask = seq + ids, mask + [float(trained)] * len(ids)
            seq, mask = seq + [tokenizer.eos_ids[0]], mask + [1.0]
        elif make_env is None:
            text, seq = p.text, tokenizer.encode(task.teacher(p, rng)) + [tokenizer.eos_ids[0]]
            mask = [1.0] * len(seq)
        else:
            text, seq, mask = scripted_episode(tokenizer, make_env(), p, task.teacher(p, rng))
        if len(seq) > width:
            question = p.text if len(p.text) <= 80 else "..." + p.text[-77:]
            raise ConfigError(
                f"warm start: the task's reference completion for {question!r} has {len(seq)} tokens, more than "
                f"the {width} new tokens a completion may have (task.options.max_new_tokens); raise that, or skip the "
                "warm start with warm_start.steps=0")
        texts.append(text)
        targets[i, : len(seq)] = seq
        target_mask[i, : len(seq)] = mask
    prompt_tokens, prompt_mask = encode_prompts(tokenizer, texts, max_tokens=task.max_prompt_tokens)
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
    checkpoint_dir: Path | None = None,
    checkpoint_every_steps: int = 100,
    log: Callable[[str], None] = print,
    progress: bool = False,
) -> nnx.Module:
    """Train `model` in place by cross-entropy on reference completions; returns it.

    With `progress`, a bar (or plain lines when the output is not a terminal) shows the steps and the loss.
    With `checkpoint_dir`, the state (params, Adam state, step, sampling RNG) is
    saved there every `checkpoint_every_steps` steps and a later call with the
    same arguments continues from the last save: a killed warm start never
    repeats finished steps, and ends exactly as an uninterrupted one.
    """
    graphdef, state = nnx.split(model)
    params = nnx.to_pure_dict(state)  # plain arrays: cheaper to pass through jit than Variables
    tx = optax.adam(learning_rate)
    opt_state = tx.init(params)
    rng = np.random.default_rng(seed)
    arrays = sft_arrays(task, tokenizer, task.train, rng)
    saves = _Saves(checkpoint_dir, checkpoint_every_steps) if checkpoint_dir is not None else None
    done = 0
    if saves is not None:
        restored = saves.restore({"params": params, "opt_state": opt_state}, log)
        if restored is not None:
            done, state, rng_state = restored
            params, opt_state = state["params"], state["opt_state"]
            rng.bit_generator.state = rng_state
            log(f"warm start: continuing from step {done} of {steps}")

    @jax.jit
    def step(params, opt_state, batch):
        def loss_fn(p):
            logp, _ = completion_logprobs(nnx.merge(graphdef, p), batch[0], batch[1], batch[2])
            return -jnp.sum(logp * batch[3]) / jnp.sum(batch[3])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    with ProgressBar(steps, enabled=progress, description="warm start") as bar:
        bar.update(done, {})
        for done in range(done + 1, steps + 1):
            rows = rng.integers(0, len(task.train), batch_size)
            params, opt_state, loss = step(params, opt_state, tuple(jnp.asarray(a[rows]) for a in arrays))
            if progress and (done % 20 == 0 or done == steps):  # reading the loss waits for the step
                bar.update(done, {"loss": float(loss)})
            if saves is not None and done % saves.every == 0 and done < steps:
                saves.save(done, {"params": params, "opt_state": opt_state}, rng.bit_generator.state)
            fault_point("warm_start", done)
    if saves is not None:
        saves.close()
    nnx.update(model, params)
    return model


class _Saves:
    """The warm start's own Orbax checkpoints (the newest one kept)."""

    def __init__(self, directory: Path, every: int) -> None:
        self.every = every
        remove_unfinished_saves(directory)
        self._manager = ocp.CheckpointManager(
            Path(directory).absolute(), options=ocp.CheckpointManagerOptions(max_to_keep=1, create=True)
        )

    def save(self, step: int, state: dict[str, Any], rng_state: dict[str, Any]) -> None:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave({"rng": rng_state}))
        self._manager.save(step, args=args, force=True)
        self._manager.wait_until_finished()

    def restore(self, like: dict[str, Any], log: Callable[[str], None]) -> tuple[int, Any, dict] | None:
        step = self._manager.latest_step()
        if step is None:
            return None
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        args = ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as e:  # noqa: BLE001 - a damaged save only costs the steps it held
            log(f"warm start: checkpoint {step} does not restore ({type(e).__name__}); starting from step 0")
            return None
        return step, restored["state"], restored["meta"]["rng"]

    def close(self) -> None:
        self._manager.close()
