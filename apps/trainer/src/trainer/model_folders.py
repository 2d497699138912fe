"""A model named by a folder or a URL (model.path, model.critic_path, a teacher's or a judge's
path): its local folder, fetched into the user's cache for a URL, and the config it holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rl_core.run import storage
from rl_models import TransformerConfig
from rl_models.hf import load_hf_config

from trainer.user_cache import user_cache_dir


def model_folder(path: str, *, only: Sequence[str] | None = None) -> str:
    """`path` itself, or for a URL (model.path=gs://...) a local copy of its files (of those in
    `only`), fetched once into the user's cache and again when they change there."""
    if not storage.is_url(path):
        return path
    return str(storage.cached_copy(path, user_cache_dir("models"), only=only))


def model_config(path: str, **runtime: Any) -> TransformerConfig:
    """The TransformerConfig of the model folder `path` (of a URL, only config.json is fetched)."""
    return load_hf_config(model_folder(path, only=("config.json",)), **runtime)
