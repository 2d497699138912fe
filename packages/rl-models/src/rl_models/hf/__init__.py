"""Hugging Face checkpoints (every family of rl_models.hf.families) from and to local folders.

Nothing here downloads: every function takes a folder on disk.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from flax import nnx

from rl_models.hf.config import (
    ARCHITECTURES,
    HFFolderError,
    folder_family,
    hf_config_from_transformer_config,
    read_json,
    transformer_config_from_hf,
)
from rl_models.hf.char_files import write_char_tokenizer
from rl_models.hf.export import export_hf
from rl_models.hf.peft import export_peft
from rl_models.hf.tokenizer import HFTokenizer
from rl_models.hf.weights import load_params
from rl_models.config import TransformerConfig
from rl_models.transformer import Transformer
from rl_models.value import ValueModel


def load_hf_config(folder: str | Path, **runtime: Any) -> TransformerConfig:
    """The TransformerConfig of `folder`'s config.json, with `runtime` settings (compute
    `dtype`, storage `param_dtype`, `remat`, ...: rl_models.config.RUNTIME_FIELDS)."""
    path = Path(folder) / "config.json"
    return transformer_config_from_hf(read_json(path), source=str(path), **runtime)


def load_hf_model(
    folder: str | Path, *, shardings: Callable[[nnx.State], Any] | None = None, **runtime: Any,
) -> Transformer:
    """The model in `folder` (config.json + safetensors), params stored in `param_dtype`.

    `shardings` (abstract param state -> a tree of shardings) places each
    parameter as it is read, one device shard at a time; see `load_params`.
    """
    path = Path(folder) / "config.json"
    hf = read_json(path)
    config = transformer_config_from_hf(hf, source=str(path), **runtime)
    return load_params(Path(folder), config, folder_family(hf, str(path)), shardings)


def load_hf_value_model(
    folder: str | Path, *, shardings: Callable[[nnx.State], Any] | None = None, confidence: bool = True,
    **runtime: Any,
) -> ValueModel:
    """A critic whose backbone is the model in `folder` (its unembedding dropped) and whose
    heads start at zero, as verl and OpenRLHF start a critic from a causal LM (`confidence`:
    see `rl_models.value`)."""
    return ValueModel(load_hf_model(folder, shardings=shardings, **runtime), confidence=confidence)


def load_hf_tokenizer(folder: str | Path) -> HFTokenizer:
    """The tokenizer in `folder` (tokenizer.json, tokenizer_config.json, ...)."""
    return HFTokenizer.from_folder(folder)


__all__ = [
    "ARCHITECTURES",
    "HFFolderError",
    "HFTokenizer",
    "export_hf",
    "export_peft",
    "hf_config_from_transformer_config",
    "load_hf_config",
    "load_hf_model",
    "load_hf_value_model",
    "load_hf_tokenizer",
    "transformer_config_from_hf",
    "write_char_tokenizer",
]
