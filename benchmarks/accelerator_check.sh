#!/usr/bin/env bash
# On a GPU or TPU host: speed and memory of Qwen2.5-shaped random models in bfloat16 compute.
#
#   benchmarks/accelerator_check.sh [OUT_DIR]      (default runs/accelerator-check)
#
# For each shape (0.5B, then 1.5B if it fits): `trainer bench` (step time, rollout
# tokens/s, MFU against the measured matmul peak and against the device's nominal
# bfloat16 peak, peak device memory), the sampler benchmark, and `trainer plan`
# for the same batch to compare its prediction with the measured peak memory.
# Nothing is downloaded. Prints one summary line per shape; JSON files in OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/accelerator-check}"
mkdir -p "$OUT"

uv run python - <<'PY'
import jax
print(f"devices: {jax.device_count()} x {jax.devices()[0].device_kind} ({jax.default_backend()})")
if jax.default_backend() == "cpu":
    raise SystemExit("no accelerator here: this check is for GPU or TPU hosts")
PY

uv run python benchmarks/sampler.py --batch 64 --prompt-tokens 128 --new-tokens 256 | tee "$OUT/sampler.txt"
# long generation: 256 sequences of up to 4k tokens through both rollout engines (paged: Pallas attention)
uv run python benchmarks/rollout_engines.py --model-preset qwen2_0_5b_shape --dtype bfloat16 --prompts 32 \
  --samples 8 --new-tokens 4096 --slots 256 --steps-per-sync 16 | tee "$OUT/rollout_engines.txt"

for shape in 0.5b 1.5b; do
  preset="qwen2.5-${shape}-shape"
  OUT="$OUT" PRESET="$preset" uv run python - <<'PY' || echo "$preset: failed (out of memory?)"
import json, os
from pathlib import Path

import jax

from trainer.bench import PRESETS, run_bench

# nominal dense bfloat16 peaks (FLOP/s) of common accelerators, by jax device_kind prefix
NOMINAL = {"NVIDIA H200": 989e12, "NVIDIA H100": 989e12, "NVIDIA A100": 312e12, "NVIDIA L4": 121e12,
           "TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12}
out, preset = Path(os.environ["OUT"]), os.environ["PRESET"]
result = run_bench(preset=preset, steps=5, output=out / f"bench-{preset}.json", log=lambda s: None)
kind = jax.devices()[0].device_kind
nominal = next((v for k, v in NOMINAL.items() if kind.startswith(k)), None)
step = result["phases"]["step"]
stats = jax.devices()[0].memory_stats() or {}
peak_gib = stats.get("peak_bytes_in_use", 0) / 2**30
p = PRESETS[preset]
print(json.dumps({
    "preset": preset,
    "device": kind,
    "step_seconds": step["mean_seconds"],
    "rollout_tokens_per_sec": result["rollout"]["tokens_per_sec"],
    "mfu_vs_measured_peak": result["mfu_step"],
    "mfu_vs_nominal_bf16_peak": (step["model_flops"] / step["mean_seconds"] / nominal) if nominal else None,
    "peak_memory_gib": peak_gib,
    "plan_command": f"trainer plan --platform {'tpu' if jax.default_backend() == 'tpu' else 'gpu'} "
                    f"--device-memory-gb {stats.get('bytes_limit', 0) / 2**30:.2f} --memory-fraction 1 "
                    f"--preset {p.model} model.dtype=bfloat16 "
                    f"training.prompts_per_step={p.prompts} algorithm.group_size={p.group_size} "
                    f"rollout.max_new_tokens={p.max_new_tokens} algorithm.beta=0.0",
}))
PY
done

# trainer plan's prediction for the same batches (compiled for CPU devices in a fresh process)
for preset in qwen2_0_5b_shape qwen2_1_5b_shape; do
  uv run trainer plan --preset "$preset" --device-memory-gb 80 model.dtype=bfloat16 \
      training.prompts_per_step=16 algorithm.group_size=8 rollout.max_new_tokens=256 algorithm.beta=0.0 \
      | tee "$OUT/plan-$preset.txt"
done
