"""`trainer export --run DIR --out HF_DIR [--step N]`: a run's policy as a Hugging Face folder.

The folder holds config.json, model.safetensors, the tokenizer files, the chat
template and generation_config.json, the layout `transformers`
(`AutoModelForCausalLM.from_pretrained`) and vLLM load. A run of a loaded
model keeps its source folder's config and tokenizer files; a run of a
built-in preset gets a config.json written from its shape and the character
tokenizer as tokenizer.json.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flax import nnx
from rl_models.hf import export_hf, write_char_tokenizer

from trainer.run_policy import load_run_policy

EXPORTED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def export_run(run_dir: str | Path, out_dir: str | Path, *, step: int | None = None) -> dict[str, Any]:
    """Write the policy of `run_dir` at checkpoint `step` (default: the latest) into `out_dir`."""
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not (out / "config.json").exists():
        raise FileExistsError(f"{out} exists and is not an exported model folder; choose an empty or new --out")
    run = load_run_policy(run_dir, step)
    model = nnx.merge(run.learner.graphdef, run.params)
    source = run.settings.model.path
    export_hf(model, out, source_dir=source)
    if source is None:
        write_char_tokenizer(out)
    return {"run": str(run_dir), "step": run.step, "out": str(out), "files": sorted(p.name for p in out.iterdir())}
