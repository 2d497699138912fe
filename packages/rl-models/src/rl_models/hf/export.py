"""Save a Transformer as a Hugging Face folder: config.json, model.safetensors
and, when given a source folder, its tokenizer and generation files.

`load_hf_model(export_hf(model, out))` gives back the same params bit for bit
(in the model's parameter dtype) and the same TransformerConfig.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from rl_models.hf.config import (
    export_family,
    family_hf_config,
    folder_family,
    read_json,
    text_model_hf,
    transformer_config_from_hf,
)
from rl_models.hf.families import FAMILIES
from rl_models.hf.weights import SINGLE_FILE, save_params
from rl_models.transformer import Transformer

# Copied from the source folder when present (config.json is handled apart).
COPIED_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "chat_template.jinja", "generation_config.json",
)


def export_hf(model: Transformer, out_dir: str | Path, *, source_dir: str | Path | None = None,
              model_type: str | None = None) -> Path:
    """Write `model` to `out_dir` (created; existing checkpoint files there are
    replaced) and return it.

    With `source_dir` (the folder the model was loaded from), its config.json is
    kept (with torch_dtype updated) after checking that it describes this model (of a
    multimodal folder, its text model's: the vision tower is not written), and its
    tokenizer/generation files are copied. Without it, config.json is written from the
    model's config by its family's record: `model_type`'s, or the one record that claims
    the config (rl_models.hf.families.infer_family).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = model.config
    if source_dir is not None:
        source = Path(source_dir)
        hf = read_json(source / "config.json")
        described = transformer_config_from_hf(
            hf, source=str(source / "config.json"), **config.runtime()
        )
        family = folder_family(hf)
        if described != config:
            diffs = [
                f"{f.name}: config.json {getattr(described, f.name)!r} vs model "
                f"{getattr(config, f.name)!r}"
                for f in dataclasses.fields(config)
                if getattr(described, f.name) != getattr(config, f.name)
            ]
            raise ValueError(f"{source / 'config.json'} does not describe this model: {diffs}")
        if family.written_as is not None:  # a multimodal folder: its text model is what was trained
            hf, family = text_model_hf(hf, family, config), FAMILIES[family.written_as]
        # weights are written as floats: a quantised source's quantization_config no longer holds
        hf = {k: v for k, v in hf.items() if k not in ("dtype", "quantization_config")} | {
            "torch_dtype": config.param_dtype}
        for name in COPIED_FILES:
            if (source / name).is_file():
                shutil.copy(source / name, out / name)
    else:
        family = export_family(config, model_type)
        hf = family_hf_config(config, family)
    for stale in [*out.glob("model-*.safetensors"), out / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    save_params(model, out / SINGLE_FILE, family)
    return out
