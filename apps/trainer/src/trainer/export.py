"""`trainer export --run DIR --out HF_DIR [--step N] [--overwrite]`: a run's policy as a Hugging Face folder.

The folder holds config.json, model.safetensors, the tokenizer files, the chat
template and generation_config.json, the layout `transformers`
(`AutoModelForCausalLM.from_pretrained`) and vLLM load. A run of a loaded
model keeps its source folder's config and tokenizer files; a run of a
built-in preset gets a config.json written from its shape and the character
tokenizer as tokenizer.json.

A LoRA run exports the merged model (each adapted kernel becomes
W + (alpha / r) A B, a quantized base dequantized first), or with `adapter=True`
the adapters alone in the PEFT layout (adapter_config.json,
adapter_model.safetensors) for use on top of the base model.

Nothing a user made is replaced by surprise: an `--out` that exists and is not
empty is refused unless `overwrite`, and then replaced as a whole (its earlier
files are not mixed with the new ones); `--out` may never be the run folder or
the model folder the run was trained from, nor hold them. The folder is written
aside (`.<name>.export-tmp`) and renamed into place when complete, so a failed
export (a full disk) leaves what was there before.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from rl_core.config import ConfigError
from rl_models.hf import export_hf, export_peft, write_char_tokenizer
from rl_models.lora import has_adapters, merge_adapters

from trainer.run import settings_of_run
from trainer.run_policy import load_run_policy

EXPORTED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def check_out(run_dir: Path, out: Path, *, source: str | None, overwrite: bool) -> None:
    """Refuse an `out` that would destroy something, before any model is loaded."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file, not a folder; choose a new or empty folder")
    target = out.resolve()
    kept = {"run folder": run_dir} | ({"model folder the run was trained from": Path(source)} if source else {})
    for what, folder in kept.items():
        folder = folder.resolve()
        if target == folder or target in folder.parents:
            raise FileExistsError(
                f"--out {out} is {'' if target == folder else 'a folder holding '}the {what} ({folder}); "
                "an export never writes over it: choose a new folder"
            )
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        shown = sorted(p.name for p in out.iterdir())
        listed = ", ".join(shown[:5]) + (", ..." if len(shown) > 5 else "")
        raise FileExistsError(
            f"--out {out} exists and is not empty ({listed}); pass --overwrite to replace it as a whole, "
            "or choose a new folder"
        )
    parent = target.parent
    while not parent.exists():
        parent = parent.parent
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"--out {out}: cannot write in {parent} (permission denied)")


def export_run(run_dir: str | Path, out_dir: str | Path, *, step: int | None = None,
               adapter: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Write the policy of `run_dir` at checkpoint `step` (default: the latest) into `out_dir`:
    a Hugging Face folder, or with `adapter` a LoRA run's adapters in the PEFT layout."""
    run_dir, out = Path(run_dir), Path(out_dir)
    settings = settings_of_run(run_dir)
    source = settings.model.path
    if adapter and not settings.model.lora.rank:
        raise ConfigError(f"--adapter: {run_dir} is not a LoRA run (model.lora.rank = 0): it has no adapter to "
                          "export; drop --adapter to export the whole model")
    check_out(run_dir, out, source=source, overwrite=overwrite)
    run = load_run_policy(run_dir, step)
    model = run.model
    tmp = out.absolute().parent / f".{out.name}.export-tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # left by an export that was killed
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        if adapter:
            if not has_adapters(model):
                raise ConfigError(f"--adapter: {run_dir}'s checkpoint holds no adapters to export")
            export_peft(model, tmp, base_model_name_or_path=source)
        else:
            export_hf(merge_adapters(model) if has_adapters(model) else model, tmp, source_dir=source)
            if source is None:
                write_char_tokenizer(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"run": str(run_dir), "step": run.step, "out": str(out), "files": sorted(p.name for p in out.iterdir())}
