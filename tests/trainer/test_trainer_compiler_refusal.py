"""A TPU compiler's refusal of a program that does not fit is `trainer plan`'s and `trainer bench`'s
verdict in one line, not a traceback (trainer.plan.refusal).

On the CPU host the refusal is raised where XLA:TPU raises it, from `Lowered.compile`, as the real
exception type with the real message the v5e chip gave for qwen2.5-0.5b-shape's update."""

from __future__ import annotations

import json

import jax
import pytest
from jax.errors import JaxRuntimeError
from trainer.cli import main
from trainer.plan import GIB, Plan, memory_budget
from trainer.plan.refusal import ProgramRefused, refusal, refusals_as_verdicts
from host import backend

TEMPORARIES = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
               "(70.66G) exceeds available HBM (15.75G).")
OLDER_LIBTPU = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
                "Used 21.95G of 15.48G hbm. Exceeded hbm capacity by 6.47G.\n\nTotal hbm usage >= 22.47G:\n"
                "    reserved        530.00M\n    program          21.95G\n    arguments            0B\n")
KERNEL_SCRATCH = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem. "
                  "Used 32.42M of 16.00M vmem. Exceeded vmem capacity by 16.42M")
VERDICT = "does NOT fit: the TPU compiler needs 70.66 GiB of temporaries, the device has 15.75 GiB"


def test_the_refusals_sizes_are_read_from_the_message():
    new = refusal(JaxRuntimeError(TEMPORARIES), "tpu")
    assert (new.needed_bytes, new.available_bytes) == (int(70.66 * GIB), int(15.75 * GIB))
    assert new.verdict() == VERDICT
    old = refusal(JaxRuntimeError(OLDER_LIBTPU), "tpu")
    assert (old.needed_bytes, old.available_bytes) == (int(21.95 * GIB), int(15.48 * GIB))
    assert old.verdict() == "does NOT fit: the TPU compiler needs 21.95 GiB in all, the device has 15.48 GiB"
    # what the total is for is the compiler's word; sizes in any of its units
    other = refusal(JaxRuntimeError(TEMPORARIES.replace("HLO temporaries (70.66G)", "program arguments (512.00M)")),
                    "tpu")
    assert (other.what, other.needed_bytes) == ("of program arguments", 512 * 2**20)


def test_only_the_compilers_refusal_of_device_memory_is_a_verdict():
    # a kernel's scratch memory is the kernel's fault; the same words in another error type, or an
    # error without RESOURCE_EXHAUSTED, are not the compiler's answer
    for error in (JaxRuntimeError(KERNEL_SCRATCH), RuntimeError(TEMPORARIES),
                  JaxRuntimeError(TEMPORARIES.replace("RESOURCE_EXHAUSTED", "INTERNAL"))):
        assert refusal(error, "tpu") is None
    with pytest.raises(JaxRuntimeError, match="vmem"), refusals_as_verdicts("tpu"):
        raise JaxRuntimeError(KERNEL_SCRATCH)
    with pytest.raises(ProgramRefused, match="70.66 GiB of temporaries"), refusals_as_verdicts("tpu"):
        raise JaxRuntimeError(TEMPORARIES)


@pytest.fixture
def refusing_compiler(monkeypatch):
    """Every program compile raises what XLA:TPU raised for a program over the chip's memory."""
    compiled = []

    def refuse(lowered, *args, **kwargs):
        compiled.append(lowered)
        raise JaxRuntimeError(TEMPORARIES)

    monkeypatch.setattr(jax.stages.Lowered, "compile", refuse)
    return compiled


def test_plan_answers_a_refusal_with_its_verdict_in_one_line(refusing_compiler, capsys):
    code = main(["plan", "--preset", "tiny", "--platform", "tpu", "training.prompts_per_step=2",
                 "algorithm.group_size=2"])
    out, err = capsys.readouterr()
    # which compiler, and the memory settings picked (counted, not compiled: model.remat=auto), then the verdict
    *notes, verdict = out.splitlines()
    assert (code, verdict, err) == (1, VERDICT, "") and refusing_compiler  # the update was compiled, and refused
    assert notes[0].startswith("tpu: ") and notes[1].startswith("  remat=none, micro-batch the whole mini-batch: counted")
    assert notes[2].startswith("memory: remat=none, micro_batch_size=whole mini-batch (picked: counted")
    assert main(["plan", "--json", "--preset", "tiny", "--platform", "tpu", "training.prompts_per_step=2",
                 "algorithm.group_size=2"]) == 1
    answer = json.loads(capsys.readouterr().out)
    assert answer == {"fits": False, "verdict": VERDICT, "refused_by": "tpu", "needed_bytes": int(70.66 * GIB),
                      "available_bytes": int(15.75 * GIB)}


def test_bench_answers_a_refusal_in_one_line_before_allocating(refusing_compiler, capsys, tmp_path):
    output = tmp_path / "bench.json"
    assert main(["bench", "--preset", "tiny", "--output", str(output)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    # this host's backend compiled (and was refused): the verdict names it (CPU here, TPU on a chip)
    assert line == (f"trainer bench: error: trainer bench --preset tiny does NOT fit: the {backend().upper()} compiler "
                    "needs 70.66 GiB of temporaries, the device has 15.75 GiB; run it on a machine with more memory, "
                    "choose a smaller preset, or keep less for the backward pass (model.remat=full)")
    assert not output.exists()


def test_bench_names_what_to_change_when_the_weights_and_optimizer_alone_do_not_fit(refusing_compiler, capsys):
    """Full fine-tuning whose float32 weights, AdamW state and gradients exceed the device (the 1.5B
    shape on a v5e): no remat helps, so the one line says to train adapters or shard, not remat=full."""
    assert main(["bench", "--preset", "tiny", "--memory-gb", "0.0001"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"trainer bench: error: trainer bench --preset tiny does NOT fit: the {backend().upper()} "
                           "compiler needs 70.66 GiB of temporaries, the device has 15.75 GiB; the float32 weights, "
                           "AdamW state and gradients alone take ")
    assert line.endswith("train adapters (model.lora.rank=16) or spread them over more devices (training.mesh.fsdp)")
    assert "model.remat=full" not in line


def test_the_search_counts_a_refused_candidate_as_too_much():
    """remat none fits nothing (20 GiB of temporaries); the compiler refuses dots_saveable's update;
    dots_with_no_batch_dims_saveable's fits: the search goes past the refusal to it."""

    from trainer.plan.search import search
    from trainer.settings import build_settings

    common = ["model.preset=tiny", "training.prompts_per_step=2", "algorithm.group_size=2"]
    budget = memory_budget("tpu", headroom=0.0)
    gib = lambda x: int(x * GIB)  # noqa: E731

    def made_up(update_gib: float) -> Plan:
        compiled = {"parameters_and_optimizer_state": gib(1), "frozen_base": 0, "reference": 0,
                    "update_temporaries": gib(update_gib), "rollout_temporaries": 0, "reference_temporaries": None}
        return Plan("m", {"data": 1, "fsdp": 1, "tensor": 1}, 1, 1, compiled, {"loaded_model": 0}, budget)

    def plan_of(settings):
        if settings.model.remat == "dots_saveable":
            raise refusal(JaxRuntimeError(TEMPORARIES), "tpu")
        return made_up(2.0)

    lines = []
    fit = search(made_up(20.0), build_settings(algo="grpo", overrides=common),
                 lambda extra: build_settings(algo="grpo", overrides=[*common, *extra]), plan_of, log=lines.append)
    assert fit.overrides == ("model.remat=dots_with_no_batch_dims_saveable",) and fit.plan.fits
    assert f"  model.remat=dots_saveable: too much ({VERDICT})" in lines
