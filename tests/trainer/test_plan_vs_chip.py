"""benchmarks/plan_vs_chip.py: the bench cases it plans and measures, the settings it gives each, its lines,
and (on CPU, the tiny preset) the chip path's learner, update compile and step."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "plan_vs_chip.py"
GIB = 2**30


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("plan_vs_chip", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_cases_are_both_shapes_full_and_lora_remat_none_and_full(script):
    assert [c.name for c in script.CASES] == [
        "0.5b full remat=none", "0.5b full remat=full", "0.5b lora16 remat=none", "0.5b lora16 remat=full",
        "1.5b full remat=none", "1.5b full remat=full", "1.5b lora16 remat=none", "1.5b lora16 remat=full"]


def test_a_case_runs_trainer_benchs_settings_with_its_remat_lora_and_micro_batch(script):
    case = script.Case("qwen2.5-1.5b-shape", True, "full")
    settings = script.case_settings(case, 64)
    assert (settings.model.preset, settings.model.remat, settings.model.lora.rank) == ("qwen2_1_5b_shape", "full", 16)
    assert settings.training.micro_batch_size == 64 and settings.model.scan_layers  # as a TPU runs it
    assert (settings.training.prompts_per_step, settings.rollout.max_new_tokens, settings.model.dtype) == (
        16, 256, "bfloat16")
    assert script.case_settings(case, None).training.micro_batch_size is None  # the whole mini-batch
    assert script.case_settings(case).training.micro_batch_size == "auto"  # the plan picks


def test_the_lines_set_the_prediction_beside_the_chips_figures_or_the_refusal(script):
    predicted = {"case": "0.5b full remat=full", "micro_batch_size": None, "verdict": "fits",
                 "peak_bytes": int(14.83 * GIB), "resident_bytes": 4 * GIB, "update_temporaries": int(10.83 * GIB),
                 "rollout_bytes": int(1.5 * GIB), "largest_program": "update", "seconds": 95.0}
    assert script.predicted_line(predicted) == (
        "0.5b full remat=full       predicted peak 14.83 GiB (resident 4.00, update 10.83, rollout 1.50; "
        "largest update; micro-batch whole) [95.0 s]")
    refused = {"case": "0.5b full remat=none", "verdict": "does NOT fit: the TPU compiler needs 70.66 GiB of "
               "temporaries, the device has 15.75 GiB"}
    assert script.predicted_line(refused).endswith("predicted: does NOT fit: the TPU compiler needs 70.66 GiB of "
                                                   "temporaries, the device has 15.75 GiB")
    measured = {"case": "0.5b full remat=full", "resident_bytes": 4 * GIB, "update_temporaries": int(10.83 * GIB),
                "compiler_peak_bytes": int(14.83 * GIB), "step_peak_bytes": int(6.14 * GIB), "step_seconds": 40.0}
    assert script.measured_line(measured) == (
        "0.5b full remat=full       measured: resident + update temporaries 14.83 GiB (resident 4.00, update "
        "10.83; micro-batch whole); step peak_bytes_in_use 6.14 (no temporaries), 40.0 s")


@pytest.mark.e2e  # builds the tiny model's learner, compiles its update and runs a step (a minute on 2 cores)
def test_the_chip_path_runs_on_cpu_with_the_tiny_preset(script):
    case = script.Case("tiny", True, "full")
    row = script.measure(case, script.case_settings(case, None), step=True)
    # a CPU's allocator reports nothing: the sizes are 0, but every program was built, compiled and run
    assert set(row) >= {"resident_bytes", "update_temporaries", "compiler_peak_bytes", "step_peak_bytes"}, row
