"""`trainer export --run DIR --out HF_DIR [--step N]`: a run's policy as a Hugging Face folder.

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
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_models.hf import export_hf, export_peft, write_char_tokenizer
from rl_models.lora import has_adapters, merge_adapters

from trainer.run_policy import load_run_policy

EXPORTED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


def export_run(run_dir: str | Path, out_dir: str | Path, *, step: int | None = None,
               adapter: bool = False) -> dict[str, Any]:
    """Write the policy of `run_dir` at checkpoint `step` (default: the latest) into `out_dir`:
    a Hugging Face folder, or with `adapter` a LoRA run's adapters in the PEFT layout."""
    out = Path(out_dir)
    marker = "adapter_config.json" if adapter else "config.json"
    if out.exists() and any(out.iterdir()) and not (out / marker).exists():
        raise FileExistsError(f"{out} exists and is not an exported {'adapter' if adapter else 'model'} folder; "
                              "choose an empty or new --out")
    run = load_run_policy(run_dir, step)
    model = run.model
    source = run.settings.model.path
    if adapter:
        if not has_adapters(model):
            raise ValueError(f"{run_dir} is not a LoRA run (model.lora.rank = 0): it has no adapter to export")
        export_peft(model, out, base_model_name_or_path=source)
        return {"run": str(run_dir), "step": run.step, "out": str(out), "files": sorted(p.name for p in out.iterdir())}
    export_hf(merge_adapters(model) if has_adapters(model) else model, out, source_dir=source)
    if source is None:
        write_char_tokenizer(out)
    return {"run": str(run_dir), "step": run.step, "out": str(out), "files": sorted(p.name for p in out.iterdir())}
