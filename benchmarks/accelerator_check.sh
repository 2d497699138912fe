#!/usr/bin/env bash
# On a GPU or TPU host: speed and memory of Qwen2.5-shaped random models in bfloat16 compute.
#
#   benchmarks/accelerator_check.sh [OUT_DIR]      (default runs/accelerator-check)
#
# Steps, each with its own time limit and its output in OUT_DIR/<step>.txt:
#   device         the devices (stops here on a host without an accelerator)
#   resume         a short GRPO run killed twice and resumed equals the uninterrupted one, bit for bit
#                  (benchmarks/resume_check.py: each run its own process on the accelerator)
#   sampler        the sampler benchmark (small model, 64 rows, 128 + 256 tokens)
#   engines        both rollout engines on the 0.5B shape: 32 prompts x 8 = 256 rows of up to 1024 new
#                  tokens (trimmed from 4096 to keep the check short)
#   bench-*        `trainer bench` (benchmarks/accelerator_check.py bench) with no memory setting:
#                  qwen2.5-0.5b-shape (about 7 minutes on one v5e, most of it compiling), qwen2.5-1.5b-shape
#                  with LoRA rank 16 (about 9), and qwen2.5-1.5b-shape trained in full (on a v5e the float32
#                  weights and AdamW state alone do not fit: the one-line verdict); step time, rollout
#                  tokens/s, MFU against the measured and the nominal bfloat16 peak, peak device memory
#   plan           `trainer plan`'s prediction for the 0.5B bench (remat full, the bench's pick on a v5e)
# OUT_DIR/summary.md gets the commit, the device, each step's status and seconds and its result lines.
# A step that fails or runs out of time is recorded and the next one runs; the whole check keeps to
# BUDGET_S seconds (default 1800), skipping the steps that no longer fit in it. Nothing is downloaded.
# STEPS="bench-0.5b plan" runs only those steps (and the device step), adding to OUT_DIR/summary.md:
# the check in parts where a host's commands are limited in time.
#
# Runs with `uv run python` where uv is installed, else with `python3` (a host without a registry,
# the workspace installed as wheels onto PYTHONPATH).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-runs/accelerator-check}"
BUDGET_S="${BUDGET_S:-1800}"
STEPS="${STEPS:-}"
NAMES="device resume sampler engines bench-0.5b bench-1.5b-lora bench-1.5b plan"
for name in $STEPS; do
  [[ " $NAMES " == *" $name "* ]] || { echo "STEPS: no step named $name (the steps: $NAMES)" >&2; exit 2; }
done
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1  # a step killed at its time limit keeps what it printed
if command -v uv >/dev/null 2>&1; then PY=(uv run python); else PY=(python3); fi
SUMMARY="$OUT/summary.md"
START=$(date +%s)
COMMIT="${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"
if [[ -n "$STEPS" && -f "$SUMMARY" ]]; then  # a further part of the check: add to its summary
  printf '\n## steps %s, %s (commit %s)\n\n' "$STEPS" "$(date -u +%Y-%m-%dT%H:%MZ)" "$COMMIT" >> "$SUMMARY"
else
  {
    echo "# accelerator check, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo
    echo "commit $COMMIT; \`benchmarks/accelerator_check.sh $OUT\` with ${PY[*]}${STEPS:+ (steps: $STEPS)}"
    echo
  } > "$SUMMARY"
fi
failed=0

# step NAME LIMIT_S PATTERN COMMAND...: run COMMAND for at most LIMIT_S seconds (less if the budget
# is nearly spent), tee its output to OUT/NAME.txt, add its status and the lines matching PATTERN to the summary
step() {
  local name=$1 limit=$2 pattern=$3 begin left rc
  shift 3
  if [[ -n "$STEPS" && "$name" != device && " $STEPS " != *" $name "* ]]; then
    return 0  # not in this part (STEPS)
  fi
  begin=$(date +%s)
  left=$((BUDGET_S - (begin - START)))
  if ((left < 30)); then
    echo "- $name: skipped (the ${BUDGET_S} s budget is spent)" >> "$SUMMARY"
    return 0
  fi
  ((limit > left)) && limit=$left
  echo "== $name (at most ${limit} s)"
  timeout "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
  rc=${PIPESTATUS[0]}
  local status="ok"
  if ((rc == 124)); then status="out of time (${limit} s)"; failed=1
  elif ((rc != 0)); then status="failed (exit $rc)"; failed=1; fi
  echo "- $name: $status, $(($(date +%s) - begin)) s" >> "$SUMMARY"
  grep -E "$pattern" "$OUT/$name.txt" | sed 's/^SUMMARY: //; s/^/    /' >> "$SUMMARY"
  return "$rc"
}

step device 60 '^devices:' "${PY[@]}" benchmarks/accelerator_check.py device || {
  echo "no accelerator: stopped after the device step" >> "$SUMMARY"; cat "$SUMMARY"; exit 1; }
step resume 300 '^(resume check|differs): ' "${PY[@]}" benchmarks/resume_check.py "$OUT/resume"
step sampler 75 '^(generated tokens/s|decode ms|compiled programs)' \
  "${PY[@]}" benchmarks/sampler.py --batch 64 --prompt-tokens 128 --new-tokens 256
step engines 120 '^ +[0-9]+ ' \
  "${PY[@]}" benchmarks/rollout_engines.py --model-preset qwen2_0_5b_shape --dtype bfloat16 --prompts 32 \
  --samples 8 --new-tokens 1024 --slots 256 --steps-per-sync 16
step bench-0.5b 540 '^SUMMARY: ' "${PY[@]}" benchmarks/accelerator_check.py bench --out "$OUT" qwen2.5-0.5b-shape
step bench-1.5b-lora 600 '^SUMMARY: ' \
  "${PY[@]}" benchmarks/accelerator_check.py bench --out "$OUT" qwen2.5-1.5b-shape model.lora.rank=16
step bench-1.5b 90 '^SUMMARY: ' "${PY[@]}" benchmarks/accelerator_check.py bench --out "$OUT" qwen2.5-1.5b-shape
# the bench's batch as `trainer plan` sees it, against the chip's allocator limit with no headroom
step plan 150 '^(peak|startup|fits|does NOT fit)' \
  "${PY[@]}" -m trainer.cli plan --preset qwen2_0_5b_shape --platform tpu --device-memory-gb 15.75 \
  --memory-fraction 1 --headroom 0 --no-search model.dtype=bfloat16 model.remat=full training.optimizer=adamw \
  task.options.digits=2 training.prompts_per_step=16 algorithm.group_size=8 rollout.max_new_tokens=256 algorithm.beta=0.0

echo "total: $(($(date +%s) - START)) s" >> "$SUMMARY"
cat "$SUMMARY"
exit "$failed"
