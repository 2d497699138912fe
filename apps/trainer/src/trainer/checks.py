"""A run's checks on its models: each turns a model the settings cannot run (too few heads for
the tensor axis, positions past what the model computes exactly, a kernel the platform lacks, a
critic on another vocabulary, weights that are not finite) into one settings error, before the
run folder exists. `trainer.build` runs them as it assembles a run, `trainer plan` on abstract
models."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx
from rl_core import ConfigError, RolloutConfig
from rl_core.runtime import mesh as mesh_lib
from rl_models import Transformer, TransformerConfig
from rl_models import attention as attention_lib
from rl_models.transformer import compute_dtype

from trainer.model_folders import model_config
from trainer.settings import RunSettings


def check_tensor_parallel(config: TransformerConfig, tensor: int) -> None:
    """A settings error when the mesh's tensor axis cannot give each device whole heads."""
    problem = config.tensor_parallel_problem(tensor)
    if problem:
        raise ConfigError(f"training.mesh.tensor = {tensor}: {problem}")


def check_positions(config: TransformerConfig, rollout: RolloutConfig) -> None:
    """A settings error when the run's longest sequence (a prompt of max_prompt_tokens, a BOS, and
    max_new_tokens after it: every turn of an episode included) is one the model does not compute
    exactly (dynamic NTK rope past its max_position_embeddings)."""
    longest = rollout.max_prompt_tokens + 1 + rollout.max_new_tokens
    problem = config.position_problem(longest)
    if problem:
        raise ConfigError(f"rollout.max_prompt_tokens + 1 + rollout.max_new_tokens = {longest}: {problem}")


def check_attention(config: TransformerConfig, platform: str | None = None) -> None:
    """A settings error when model.attention names a kernel this run's platform does not have."""
    try:
        attention_lib.resolve(config.attention, dtype=compute_dtype(config), head_dim=config.head_dim,
                              platform=platform)
    except ValueError as e:
        raise ConfigError(f"model.{e}") from None


def check_critic(settings: RunSettings, policy: Transformer) -> None:
    """A settings error when `model.critic_path`'s model cannot read the policy's tokens or cannot
    be laid out on the mesh (reads its config.json only)."""
    path = settings.model.critic_path
    if path is None:
        return
    config = model_config(path, **settings.model.runtime())
    if config.vocab_size != policy.config.vocab_size:
        raise ConfigError(
            f"model.critic_path = {path!r}: its vocabulary has {config.vocab_size} tokens and the policy's "
            f"{policy.config.vocab_size}; the critic reads the policy's tokens, so both must share one tokenizer"
        )
    check_tensor_parallel(config, mesh_lib.training_mesh(settings.training).shape["tensor"])


def check_finite(settings: RunSettings, model: Transformer) -> None:
    """Refuse a model whose weights hold NaN or inf: every update would be non-finite and skipped."""
    bad = [
        "/".join(map(str, path))
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))
        if jnp.issubdtype(var[...].dtype, jnp.floating) and not bool(jnp.isfinite(var[...]).all())
    ]
    if bad:
        where = f"model.path = {settings.model.path!r}" if settings.model.path else f"model.preset = {settings.model.preset!r}"
        shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise ConfigError(
            f"{where}: the weights hold NaN or infinite values ({shown}); every update from them would be "
            "non-finite, so the run does not start"
        )
