"""Save a Transformer's LoRA adapters in the PEFT layout (`adapter_config.json`,
`adapter_model.safetensors`), which `peft.PeftModel.from_pretrained(base, folder)`
and vLLM's LoRA support load on top of the Hugging Face base model.

Tensor names are PEFT's: `base_model.model.<the base's module>.lora_A.weight`
[r, in] and `.lora_B.weight` [out, r] (A and B here are [in, r] and [r, out]: the
transposes), e.g. `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight`.
PEFT scales B A by lora_alpha / r, as the adapters here do.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rl_models.hf.families import infer_family
from rl_models.hf.weight_maps import row_range, split_key
from rl_models.hf.weights import save_safetensors
from rl_models.lora import linears
from rl_models.transformer import Transformer

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"


def peft_tensors(model: Transformer) -> dict[str, np.ndarray]:
    """PEFT name -> float32 array of every adapter of `model`."""
    adapted = {path: lin for path, lin in linears(model).items() if lin.lora_a is not None}
    family = infer_family(model.config)
    weights = family.weights(model.config)
    fused = sorted({split_key(key)[0].split(".")[-2] for key, slot in weights.items()
                    if row_range(key) is not None and "/".join(slot.path[:-1]) in adapted})
    if fused:  # PEFT adapts a fused module whole: an adapter of some of its rows has no PEFT name
        raise ValueError(f"{family.model_type} fuses q/k/v and gate/up into one module each ({', '.join(fused)}), "
                         "which PEFT adapts as one: adapters of the separate projections are not written in its "
                         "layout (merge them into the weights and export_hf the model instead)")
    tensors = {}
    for key, slot in weights.items():
        owner = "/".join(slot.path[:-1])
        if slot.path[-1] != "kernel" or owner not in adapted:
            continue
        lin = adapted.pop(owner) if slot.layer is None else adapted[owner]
        a, b = (np.asarray(v[...], np.float32) for v in (lin.lora_a, lin.lora_b))
        if slot.layer is not None:
            a, b = a[slot.layer], b[slot.layer]
        stem = "base_model.model." + key.removesuffix(".weight")
        tensors[f"{stem}.lora_A.weight"] = np.ascontiguousarray(a.T)
        tensors[f"{stem}.lora_B.weight"] = np.ascontiguousarray(b.T)
    return tensors


def peft_config(model: Transformer, base_model_name_or_path: str | None) -> dict:
    """adapter_config.json for `model`'s adapters (one rank and alpha for every target)."""
    adapted = [(path, lin) for path, lin in linears(model).items() if lin.lora_a is not None]
    if not adapted:
        raise ValueError("the model has no LoRA adapters to export")
    rank = int(adapted[0][1].lora_a.shape[-1])
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": rank,
        "lora_alpha": float(adapted[0][1].lora_scale * rank),
        "lora_dropout": 0.0,
        "target_modules": sorted({path.rsplit("/", 1)[-1] for path, _ in adapted}),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "inference_mode": True,
    }


def export_peft(model: Transformer, out_dir: str | Path, *, base_model_name_or_path: str | None = None) -> Path:
    """Write `model`'s adapters to `out_dir` (created) in the PEFT layout and return it."""
    out = Path(out_dir)
    config = peft_config(model, base_model_name_or_path)
    out.mkdir(parents=True, exist_ok=True)
    (out / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    save_safetensors(peft_tensors(model), out / ADAPTER_WEIGHTS)
    return out


__all__ = ["ADAPTER_CONFIG", "ADAPTER_WEIGHTS", "export_peft", "peft_config", "peft_tensors"]
