"""`trainer plan`: the per-device memory of a run, from its compiled programs (no weights loaded).

Only the light modules are imported here (the planner imports JAX and the model code inside
`plan`), so that `simulate_devices` can still set the device count before JAX starts a backend;
the search for settings that fit is `trainer.plan.search`, imported after it.
"""

from trainer.plan.device_memory import GIB, MemoryBudget, memory_budget
from trainer.plan.planner import plan, simulate_devices, training_peak
from trainer.plan.result import LOADED_MODEL, Plan

__all__ = ["GIB", "LOADED_MODEL", "MemoryBudget", "Plan", "memory_budget", "plan", "simulate_devices", "training_peak"]
