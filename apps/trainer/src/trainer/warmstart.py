"""Supervised warm start: imitate the task's reference completions for a few hundred steps.

RL needs a base policy that is right sometimes but not always; a short run of
next-token cross-entropy on (prompt, reference + EOS) pairs gives one, from
the same seed every time.

With `packing`, each step's sequences (their real prompt tokens, then their targets up to the last
trained token) are packed into as few rows as fit (rl_core.train.packing, as the RL update packs):
positions restart and attention stops at each sequence's boundary, so every token gets the
log-prob it gets unpacked and the loss (the mean over the trained tokens) is the same, computed
on fewer rows. `metrics_path` receives one JSON line per step (`SFT_METRIC_KEYS`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from rl_core.run import fault_point, ProgressBar, remove_unfinished_saves
from rl_core import completion_logprobs, ConfigError, encode_prompts, environment_factory, Prompt, Tokenizer
from rl_core.episodes import scripted_episode
from rl_core.train import pack

from trainer.tasks import Task

SFT_METRIC_KEYS = ("step", "loss", "tokens", "rows", "row_tokens", "padding_frac", "time/step")
"""step; loss (mean cross-entropy over the trained tokens); tokens (trained tokens in the step); rows and
row_tokens (rows the step computed and their width: packed rows, or one row per sequence); padding_frac
(the share of the rows' positions that hold no token); time/step (seconds, averaged over the steps between
two reads of the loss)."""
LOG_EVERY = 20
"""Steps between reads of the loss (each read waits for the step): progress and the metrics file."""


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


def sft_loss(model: nnx.Module, batch: tuple[jax.Array, ...], packed: Any = None) -> jax.Array:
    """The mean cross-entropy over the trained target tokens of `batch` (`sft_arrays`' four arrays), on the
    sequences `packed` into rows (rl_core.train.packing.pack of the same arrays) or one row each."""
    logp, _ = completion_logprobs(model, batch[0], batch[1], batch[2], packed=packed)
    return -jnp.sum(logp * batch[3]) / jnp.sum(batch[3])


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
    packing: bool = False,
    row_tokens: int | None = None,
    metrics_path: Path | None = None,
) -> nnx.Module:
    """Train `model` in place by cross-entropy on reference completions; returns it.

    `packing` packs each step's sequences into fewer rows of `row_tokens` (at least the prompt width plus
    max_new_tokens, the default) (the same loss; see the module docstring);
    `metrics_path` gets one JSON line per step (`SFT_METRIC_KEYS`), written every `LOG_EVERY` steps.

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
    metrics = _Metrics(metrics_path, done)
    width = max(row_tokens or 0, arrays[1].shape[1] + arrays[3].shape[1])  # one row always holds a sequence

    @jax.jit
    def step(params, opt_state, batch, packed):
        loss, grads = jax.value_and_grad(lambda p: sft_loss(nnx.merge(graphdef, p), batch, packed))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    with ProgressBar(steps, enabled=progress, description="warm start") as bar:
        bar.update(done, {})
        for done in range(done + 1, steps + 1):
            rows = rng.integers(0, len(task.train), batch_size)
            batch = tuple(a[rows] for a in arrays)
            packed = pack(*batch, width=width) if packing else None
            # numpy in: the program's dispatch places it (jnp.asarray would run an eager op a field)
            params, opt_state, loss = step(params, opt_state, batch, packed)
            metrics.add(done, loss, batch, packed)
            if done % LOG_EVERY == 0 or done == steps:  # reading the loss waits for the step
                last = metrics.flush()
                if progress:
                    bar.update(done, {"loss": last})
            if saves is not None and done % saves.every == 0 and done < steps:
                metrics.flush()  # the file holds every step the checkpoint holds
                saves.save(done, {"params": params, "opt_state": opt_state}, rng.bit_generator.state)
            fault_point("warm_start", done)
    metrics.flush()
    if saves is not None:
        saves.close()
    nnx.update(model, params)
    return model


class _Metrics:
    """The warm start's per-step records, read from the device every LOG_EVERY steps and appended to its
    file; a continued warm start first drops the records past the step it continues from."""

    def __init__(self, path: Path | None, done: int) -> None:
        self.path = path
        self.pending: list[tuple[int, Any, dict[str, float]]] = []
        self.since = time.perf_counter()
        if path is not None and path.exists():
            kept = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= done]
            path.write_text("".join(line + "\n" for line in kept))

    def add(self, step: int, loss: Any, batch: tuple[np.ndarray, ...], packed: Any) -> None:
        prompt_mask, target_mask = batch[1], batch[3]
        if packed is None:  # one row per sequence, its prompt bucket and target width
            rows, width = prompt_mask.shape[0], prompt_mask.shape[1] + target_mask.shape[1]
            filled = float(prompt_mask.sum() + (target_mask.shape[1] - np.argmax(target_mask[:, ::-1] > 0, axis=1)).sum())
        else:
            rows, width = packed.segments.shape
            filled = float((np.asarray(packed.segments) > 0).sum())
        self.pending.append((step, loss, {"tokens": float(target_mask.sum()), "rows": float(rows),
                                          "row_tokens": float(width), "padding_frac": 1.0 - filled / (rows * width)}))

    def flush(self) -> float | None:
        """Write the pending records (waiting for their steps); the last loss."""
        if not self.pending:
            return None
        losses = [float(loss) for _, loss, _ in self.pending]
        seconds = (time.perf_counter() - self.since) / len(self.pending)
        if self.path is not None:
            with self.path.open("a") as f:
                for (step, _, stats), loss in zip(self.pending, losses, strict=True):
                    f.write(json.dumps({"step": step, "loss": loss, **stats, "time/step": seconds}) + "\n")
        self.pending, self.since = [], time.perf_counter()
        return losses[-1]


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
