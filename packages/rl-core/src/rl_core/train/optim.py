"""The optimizer (optax) built from `TrainingConfig`."""

from __future__ import annotations

import optax

from rl_core.config import TrainingConfig


def learning_rate_schedule(config: TrainingConfig, total_updates: int) -> optax.Schedule:
    """Linear warm-up, then constant, cosine or linear decay over `total_updates`."""
    peak = config.learning_rate
    decay_steps = max(total_updates - config.warmup_steps, 1)
    if config.lr_schedule == "constant":
        after = optax.constant_schedule(peak)
    elif config.lr_schedule == "cosine":
        after = optax.cosine_decay_schedule(peak, decay_steps)
    else:
        after = optax.linear_schedule(peak, 0.0, decay_steps)
    if not config.warmup_steps:
        return after
    warmup = optax.linear_schedule(0.0, peak, config.warmup_steps)
    return optax.join_schedules([warmup, after], [config.warmup_steps])


def make_optimizer(config: TrainingConfig, total_updates: int) -> optax.GradientTransformation:
    lr = learning_rate_schedule(config, total_updates)
    if config.optimizer == "adamw":
        opt = optax.adamw(lr, weight_decay=config.weight_decay)
    elif config.optimizer == "adam":
        opt = optax.adam(lr)
    else:
        opt = optax.sgd(lr)
    if config.max_grad_norm is None:
        return opt
    return optax.chain(optax.clip_by_global_norm(config.max_grad_norm), opt)
