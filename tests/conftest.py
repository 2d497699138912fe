"""Shared pytest setup for the whole test suite (keep it small)."""

import os
from pathlib import Path

import pytest

import jax
from host import backend, skip_unless_cpu
from rl_core.runtime.compiles import use_persistent_cache
from rl_core.runtime.cpu_random import unroll_threefry_on_cpu
from rl_core.runtime.host_memory import keep_freed_memory
from tolerances import SUITE_MATMUL_PRECISION

# --- faster XLA compiles -------------------------------------------------------------------------
# The test programs are tiny, so XLA:CPU's compile time dominates the suite. LLVM optimization
# level 0 halves it, and XLA:CPU's older (non-MLIR) fusion emitters take another third off; same
# semantics, other rounding in the last bit of some fused ops. XLA reads XLA_FLAGS once, when jax
# first starts a backend, so this runs before any test imports jax; subprocess tests inherit it.
# An explicit setting in the environment wins.
TRAINER_XLA_FLAGS = os.environ.setdefault("RL_VARIANTS_TRAINER_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
"""XLA_FLAGS as the trainer would get them, before the suite's compile-time flags. Kept in the
environment: pytest-xdist's workers inherit XLA_FLAGS with the flags below already added, and
would otherwise take those for the trainer's."""
for flag in ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"):
    if flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip()


@pytest.fixture(scope="session")
def trainer_xla_flags() -> str:
    """For subprocesses that must run XLA as `trainer` does (the long learning runs)."""
    return TRAINER_XLA_FLAGS

# --- as the trainer does: compiled programs are kept on disk and shared ---------------------------
# Tests, xdist workers and the trainer processes that tests start build many of the same programs;
# loading one from JAX's persistent cache costs milliseconds. pytest's own cache folder holds it
# (gitignored); subprocesses inherit the settings through the environment.
use_persistent_cache(Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax-compilation-cache")

# --- as the trainer does: XLA:CPU reuses freed buffers instead of page-faulting fresh ones ----
keep_freed_memory()
# --- as the trainer does: random draws lowered without a loop on CPU (the same bits) ---------------
unroll_threefry_on_cpu()


# --- the multidevice tier runs in processes with 8 simulated devices ------------------------------
MULTIDEVICE_TIER_DEVICES = 8


def pytest_configure(config):
    """`-m multidevice` alone: 8 CPU devices in this process (and each xdist worker, which runs
    this too), set before JAX starts its backend, so the mesh scripts run in-process
    (tests/support/simulated_devices.py). Children are not affected: it is a setting of
    this process, not of the environment. Every other selection keeps one device."""
    if config.getoption("markexpr", "").strip() == "multidevice":
        import jax

        jax.config.update("jax_num_cpu_devices", MULTIDEVICE_TIER_DEVICES)


# --- on an accelerator (scripts/tpu-tests.sh): on CPU none of this changes anything ---------------
def pytest_runtest_setup(item):
    """Tests about XLA:CPU itself skip (tests/support/host.py)."""
    skip_unless_cpu(item)


@pytest.fixture(scope="session", autouse=True)
def on_an_accelerator():
    """float32 products at full precision (tests/support/tolerances.py says why), and the
    processes tests start run on the CPU: one process holds a chip, and this one has it (JAX read
    JAX_PLATFORMS when it started, so the setting is its children's only)."""
    if backend() == "cpu":
        return
    if precision := SUITE_MATMUL_PRECISION.get(backend()):
        jax.config.update("jax_default_matmul_precision", precision)
    os.environ["JAX_PLATFORMS"] = "cpu"


# --- the longest files first ----------------------------------------------------------------------
# pytest-xdist (--dist=loadfile --no-loadscope-reorder) hands whole files to its workers in
# collection order. Started first, the long files share out over the workers; started last, one
# of them would keep a single core busy after the other has finished. Seconds measured in a
# run of the whole suite on 2 cores (2026-12-02, AMD EPYC: 21 min 55 s), both cores busy.
LONGEST_FIRST = [
    "test_guides.py",  # 355-605 (2026-12-04, loaded): every guide's commands in clean copies, one file
    "test_trainer_learning.py",  # 150: its first run makes the shared base policy of the learning tests
    "test_algo_conformance.py",  # 205: every algorithm, a few learners each
    "test_algo_loss_invariance_mesh.py",  # 226 (2026-12-04, load 5-7): 13 configs x 6 layouts, one process
    "test_trainer_crash_resume.py",  # 149: eleven trainer processes in a row, then an async run
    "test_trainer_learning_multiturn.py",  # 140: its own warm start and 12 steps of episodes
    "test_algo_mesh_parallel.py",  # 138: one process, every mesh of 8 simulated devices
    "test_trainer_plan.py",  # 105: plans on 8 simulated devices, a 7B search
    "test_trainer_resume.py",  # 98
    "test_trainer_multiturn.py",  # 95: trainer compare over every variant on episodes
    "test_trainer_multihost.py",  # 89: five trainer processes
    "test_models_smollm2.py",  # 60-220: SmolLM2-135M converted, its parity, a GRPO step of it
    "test_trainer_lora.py",  # 87
    "test_trainer_learning_ppo.py",  # 78: 150 steps of 256 prompts, a critic beside the policy
    "test_trainer_learning_lora.py",  # 70
    "test_algo_interleaved_processes.py",  # 62: three processes
    "test_core_engine.py",  # 59
    "test_models_transformer.py",  # 57
    "test_core_learner.py",  # 53
    "test_trainer_plugin.py",  # 43
    "test_trainer_bench.py",  # 43
    "test_models_attention.py",  # 39
    "test_trainer_compare.py",  # 38
    "test_trainer_learning_control.py",  # 35: one 100-step run
]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole
