"""benchmarks/accelerator_check.sh runs only on an accelerator host, so CI checks what it calls:
its Python steps import the current bench API, and every command line it runs parses (the
benchmark scripts' flags, the presets, the `trainer plan` settings)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "accelerator_check.sh"


def check_module():
    """benchmarks/accelerator_check.py, imported as the script runs it (its imports are the bench API)."""
    spec = importlib.util.spec_from_file_location("accelerator_check", ROOT / "benchmarks" / "accelerator_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def steps() -> dict[str, list[str]]:
    """Each `step NAME LIMIT PATTERN COMMAND...` of the script: NAME -> COMMAND's words after the interpreter."""
    text = SCRIPT.read_text().replace("\\\n", " ")
    out = {}
    for line in text.splitlines():
        if line.startswith("step "):
            words = shlex.split(line.split(" || ")[0])
            assert words[4] == "${PY[@]}", line  # uv run python, or python3 where uv is absent
            out[words[1]] = words[5:]
    return out


def test_the_script_runs_every_step_it_describes():
    names = ["device", "resume", "sampler", "engines", "bench-0.5b", "bench-1.5b-lora", "bench-1.5b", "plan"]
    assert list(steps()) == names
    text = SCRIPT.read_text()
    assert 'PY=(python3)' in text and "summary.md" in text
    assert f'NAMES="{" ".join(names)}"' in text  # what STEPS may name


def test_steps_naming_no_step_is_refused_before_anything_runs(tmp_path):
    import subprocess

    run = subprocess.run(["bash", str(SCRIPT), str(tmp_path / "out")], capture_output=True, text=True, timeout=60,
                         env={"STEPS": "bench-0.5b benchh", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 2 and "STEPS: no step named benchh" in run.stderr
    assert not (tmp_path / "out" / "summary.md").exists()


def test_the_benchmark_scripts_take_the_flags_the_check_passes():
    for name in ("sampler", "engines"):
        script, *args = steps()[name]
        source = (ROOT / script).read_text()
        flags = [a for a in args if a.startswith("--")]
        assert flags, name
        for flag in flags:
            assert f'add_argument("{flag}"' in source, (name, flag)


def test_the_bench_steps_name_presets_and_settings_the_bench_takes():
    from trainer.bench.measure import bench_settings
    from trainer.bench.presets import PRESETS

    module = check_module()
    for name in ("bench-0.5b", "bench-1.5b-lora", "bench-1.5b"):
        script, *args = steps()[name]
        assert script == "benchmarks/accelerator_check.py"
        parsed = module.parser().parse_args(args)
        assert parsed.command == "bench" and parsed.preset in PRESETS, name
        bench_settings(PRESETS[parsed.preset], steps=1, overrides=parsed.overrides)  # unknown keys raise
    assert module.parser().parse_args(steps()["device"][1:]).command == "device"


def test_the_plan_step_plans_the_bench_it_is_compared_with():
    """Its settings are valid and equal the 0.5B bench's (remat full), the fields a plan reads."""
    from trainer.bench.measure import bench_settings
    from trainer.bench.presets import PRESETS
    from trainer.cli import _parser
    from trainer.settings import build_settings

    module, args = steps()["plan"][0:2], steps()["plan"][2:]
    assert module == ["-m", "trainer.cli"]
    parsed = _parser().parse_args(args)
    planned = build_settings(algo=parsed.algo, overrides=[f"model.preset={parsed.preset}", *parsed.overrides])
    benched = bench_settings(PRESETS["qwen2.5-0.5b-shape"], steps=1, overrides=["model.remat=full"])
    for part in ("model", "rollout", "algorithm_config"):
        a, b = getattr(planned, part), getattr(benched, part)
        assert (a() if callable(a) else a) == (b() if callable(b) else b), part
    assert (planned.training.prompts_per_step, planned.training.optimizer) == (16, "adamw")


@pytest.mark.e2e  # a tiny bench (about 30 s of CPU)
def test_the_bench_step_writes_its_summary(tmp_path, capsys):
    module = check_module()
    assert module.main(["bench", "--out", str(tmp_path), "--steps", "1", "tiny"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("SUMMARY: ")]
    assert re.fullmatch(r"SUMMARY: tiny: step \d+\.\d{3} s \(rollout .*; 0 compiles after the first step", line), line
    numbers = json.loads((tmp_path / "summary-tiny.json").read_text())
    assert numbers["preset"] == "tiny" and numbers["step_seconds"] > 0 and numbers["mfu_vs_measured_peak"] > 0
    assert (tmp_path / "bench-tiny.json").exists()


@pytest.mark.e2e
def test_a_bench_step_that_does_not_fit_reports_the_verdict_and_succeeds(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("trainer.bench.memory_check.available", lambda memory_gb=None: (1024, "a made-up 1 KiB"))
    assert check_module().main(["bench", "--out", str(tmp_path), "tiny"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("SUMMARY: ")]
    assert line.startswith("SUMMARY: tiny: trainer bench --preset tiny needs ") and "are free (a made-up 1 KiB)" in line
