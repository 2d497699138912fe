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

`--run` and `--out` may be URLs (gs://bucket/..., any fsspec filesystem; see
rl_core.run.storage): a run at a URL is read from a local copy; an export to a URL is
written locally, then uploaded with config.json (or adapter_config.json) last, so
a reader that finds it finds the rest, and the files of an export it replaces are
removed after.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rl_core.run import storage
from rl_core import ConfigError
from rl_models.hf import export_hf, export_peft, write_char_tokenizer
from rl_models.lora import has_adapters, merge_adapters

from trainer import build
from trainer.run import load_run_policy, readable_run, settings_of_run

EXPORTED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def check_out(run_dir: Path, out: Path, *, source: str | None, overwrite: bool) -> None:
    """Refuse an `out` that would destroy something, before any model is loaded."""
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file, not a folder; choose a new or empty folder")
    target = out.resolve()
    kept = {"run folder": run_dir} | (
        {"model folder the run was trained from": Path(source)} if source and not storage.is_url(source) else {})
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


def check_url_out(run_dir: str | Path, url: str, *, source: str | None, overwrite: bool) -> None:
    """`check_out` for an `--out` URL."""
    for what, folder in {"run folder": run_dir, "model folder the run was trained from": source}.items():
        if isinstance(folder, str) and storage.is_url(folder):
            inside, folder = url.rstrip("/"), folder.rstrip("/")
            if inside == folder or folder.startswith(inside + "/"):
                raise FileExistsError(
                    f"--out {url} is {'' if inside == folder else 'a folder holding '}the {what} ({folder}); "
                    "an export never writes over it: choose a new folder"
                )
    is_file, names = storage.listing(url)
    if is_file:
        raise FileExistsError(f"--out {url} is a file, not a folder; choose a new or empty folder")
    if names and not overwrite:
        listed = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "")
        raise FileExistsError(
            f"--out {url} exists and is not empty ({listed}); pass --overwrite to replace it as a whole, "
            "or choose a new folder"
        )


def export_run(run_dir: str | Path, out_dir: str | Path, *, step: int | None = None,
               adapter: bool = False, overwrite: bool = False) -> dict[str, Any]:
    """Write the policy of `run_dir` at checkpoint `step` (default: the latest) into `out_dir`:
    a Hugging Face folder, or with `adapter` a LoRA run's adapters in the PEFT layout. Either may be a URL."""
    if storage.is_url(out_dir):
        check_url_out(run_dir, out_dir, source=settings_of_run(run_dir).model.path, overwrite=overwrite)
        with tempfile.TemporaryDirectory(prefix="rl-variants-export-") as tmp:
            result = export_run(run_dir, Path(tmp) / "export", step=step, adapter=adapter)
            storage.replace_folder(Path(tmp) / "export", out_dir, last=("config.json", "adapter_config.json"))
        return result | {"out": out_dir}
    if storage.is_url(run_dir):
        with readable_run(run_dir) as local:
            return export_run(local, out_dir, step=step, adapter=adapter, overwrite=overwrite) | {"run": run_dir}
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
            export_hf(merge_adapters(model) if has_adapters(model) else model, tmp,
                      source_dir=build.model_folder(source) if source else None)
            if source is None:
                write_char_tokenizer(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"run": str(run_dir), "step": run.step, "out": str(out), "files": sorted(p.name for p in out.iterdir())}
