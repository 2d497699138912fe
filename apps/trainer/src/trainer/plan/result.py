"""The result of `trainer plan` (trainer.plan): per-device bytes, measured and counted, against a
memory budget; the resident state, each program's temporaries, the peak, the table and the verdict."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainer.plan.device_memory import GIB, MemoryBudget

LOADED_MODEL = {
    "freed": "freed once the learner has its float32 copy (beta = 0: no reference); counted at startup only",
    "reference": "kept as the reference model (beta != 0): counted there",
    "frozen_base": "kept as the frozen base of the adapters (LoRA): counted there",
}
"""Where the weights as loaded go, by Plan.loaded_model."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """Per-device bytes of one run, measured (compiled programs) and counted."""

    model: str
    mesh: dict[str, int]
    parameters: int
    """Total parameter count."""
    trainable: int
    """Parameters that train (the adapters of a LoRA run; else every parameter)."""
    compiled: dict[str, int | None]
    """Per-device bytes read from the compiled programs (None: a program the run does not use)."""
    analytic: dict[str, int]
    budget: MemoryBudget
    engine: str = "static"
    """The rollout engine (rollout.engine, "auto" resolved: rl_core.rollout.factory.resolve_engine)."""
    mean_new_tokens: int = 0
    """The mean completion length the paged engine's in-use KV is counted at."""
    attention: str = "xla"
    """The attention kernel model.attention resolves to on the budget's platform."""
    auto_attention: str = "xla"
    """The kernel model.attention=auto would give on the budget's platform."""
    loaded_model: str = "freed"
    """Where the weights as loaded stay (a key of LOADED_MODEL)."""
    critic_trainable: int = 0
    """Parameters the critic trains (0: the algorithm has no critic); see trainer.plan.critic."""
    teacher_parameters: int = 0
    """Parameters of the distillation teacher (0: the run does not distill); see trainer.plan.teacher."""
    judge_parameters: int = 0
    """Parameters of the judge model (0: no judge); see trainer.plan.judge."""

    @property
    def resident_bytes(self) -> int:
        """What stays on the device between programs: master weights, optimizer state, frozen
        base, reference, a critic's master weights and optimizer state, a distillation teacher and a judge."""
        c = self.compiled
        critic = c["critic_parameters_and_optimizer_state"] if self.critic_trainable else 0
        teacher = c["teacher"] if self.teacher_parameters else 0
        judge = c["judge"] if self.judge_parameters else 0
        return c["parameters_and_optimizer_state"] + c["frozen_base"] + c["reference"] + critic + teacher + judge

    @property
    def startup_bytes(self) -> int:
        """While the learner is built: the resident state and, when they are about to be freed, the
        model as loaded and a critic loaded from its own folder."""
        critic = self.analytic["critic_loaded_model"] if self.critic_trainable else 0
        return self.resident_bytes + (self.analytic["loaded_model"] if self.loaded_model == "freed" else 0) + critic

    @property
    def program_bytes(self) -> dict[str, int]:
        """The temporaries of each program the run uses (they run one at a time)."""
        c, a = self.compiled, self.analytic
        # the paged engine holds its pool and its weight copy while it generates
        rollout = (c["rollout_temporaries"] + a.get("rollout_weight_copy", 0) if self.engine == "static"
                   else a["engine_kv_pool"] + a.get("engine_state_pool", 0) + a["engine_weights"])
        programs = {"update": c["update_temporaries"], "rollout": rollout, "reference": c["reference_temporaries"] or 0}
        if self.critic_trainable:  # its update and its values pass at collection time
            programs |= {"critic_update": c["critic_update_temporaries"],
                         "critic_values": c["critic_values_temporaries"]}
        if self.teacher_parameters:  # the teacher's log-prob pass
            programs["teacher"] = c["teacher_temporaries"]
        if self.judge_parameters:  # the judge scoring a step's completions
            programs["judge"] = c["judge_temporaries"]
        return programs

    @property
    def peak_bytes(self) -> int:
        """Resident state plus the largest program's temporaries, or the startup, whichever is more."""
        return max(self.resident_bytes + max(self.program_bytes.values()), self.startup_bytes)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.budget.limit_bytes

    @property
    def margin_bytes(self) -> int:
        """The plan's limit less its peak (negative: by how much it does not fit)."""
        return self.budget.limit_bytes - self.peak_bytes

    def table(self) -> str:
        def gib(n: int) -> str:
            return f"{n / GIB:9.2f}"

        a, c = self.analytic, self.compiled
        paged = self.engine == "paged"
        rows = [
            ("parameters (float32) + optimizer state", c["parameters_and_optimizer_state"],
             a["parameters"] + a["optimizer_state"]),
            ("  of which parameters (analytic)", None, a["parameters"]),
            ("frozen base (LoRA)", c["frozen_base"], a["frozen_base"]),
            ("reference model", c["reference"], a["reference"]),
            ("gradients + update activations", c["update_temporaries"], a["gradients"] + a["activations"]),
            ("  of which gradients (analytic)", None, a["gradients"]),
            ("  of which activations, one micro-batch", None, a["activations"]),
            (None if paged else "rollout: KV cache + sampler temporaries", c["rollout_temporaries"], a["kv_cache"]),
            ("  of which linear-attention state (any length)" if a.get("recurrent_state") else None, None,
             a.get("recurrent_state")),
            ("rollout: weight copy in rollout.weights_dtype" if a.get("rollout_weight_copy") else None, None,
             a.get("rollout_weight_copy")),
            ("rollout engine (paged): KV page pool" if paged else None, None, a["engine_kv_pool"]),
            (f"  in use at a mean of {self.mean_new_tokens} new tokens" if paged else None, None,
             a["engine_kv_in_use"]),
            ("rollout engine (paged): linear-attention state rows" if paged and a.get("engine_state_pool") else None,
             None, a.get("engine_state_pool")),
            ("  the static sampler's KV cache would be" if paged else None, None, a["kv_cache"]),
            ("rollout engine: inference weight copy" if paged else None, None, a["engine_weights"]),
            ("reference log-prob pass temporaries" if c["reference_temporaries"] is not None else None,
             c["reference_temporaries"], None),
        ]
        if self.critic_trainable:
            rows += [
                ("critic: parameters + optimizer state", c["critic_parameters_and_optimizer_state"],
                 a["critic_parameters"] + a["critic_optimizer_state"]),
                ("critic: gradients + update activations", c["critic_update_temporaries"],
                 a["critic_gradients"] + a["critic_activations"]),
                ("critic: values pass temporaries", c["critic_values_temporaries"], None),
            ]
        if self.teacher_parameters:
            rows += [
                (f"distillation teacher ({self.teacher_parameters / 1e9:.2f}B parameters)", c["teacher"], a["teacher"]),
                ("teacher log-prob pass temporaries", c["teacher_temporaries"], None),
            ]
        if self.judge_parameters:
            rows += [
                (f"judge model ({self.judge_parameters / 1e9:.3f}B parameters, device 0)", c["judge"], a["judge"]),
                ("judge scoring temporaries", c["judge_temporaries"], a["judge_kv_cache"] + a["judge_engine"]),
            ]
        mesh = " x ".join(f"{k}={v}" for k, v in self.mesh.items())
        lora = self.trainable != self.parameters
        trained = f"; {self.trainable:,} trainable ({self.trainable / self.parameters:.2%}, LoRA)" if lora else ""
        trained += f"; critic: {self.critic_trainable:,} trained" if self.critic_trainable else ""
        lines = [
            f"{self.model}: {self.parameters / 1e9:.2f}B parameters{trained} on mesh {mesh}; "
            f"attention {self.attention} on {self.budget.platform}",
            f"{'per device (GiB)':42s} {'compiled':>9s} {'analytic':>9s}",
        ]
        for name, compiled, analytic in rows:
            if name is not None:
                lines.append(f"{name:42s} {gib(compiled) if compiled is not None else ' ' * 9} "
                             f"{gib(analytic) if analytic is not None else ' ' * 9}")
        lines.append(f"{'peak (resident + largest program)':42s} {gib(self.peak_bytes)}")
        lines.append(f"{'startup (resident + the model as loaded)':42s} {gib(self.startup_bytes)}")
        lines.append(f"the model as loaded ({a['loaded_model'] / GIB:.2f} GiB per device): "
                     f"{LOADED_MODEL[self.loaded_model]}")
        if lora and a["reference_saved"]:
            lines.append(f"reference = the frozen base with adapters off: no second copy of the weights "
                         f"(saves {a['reference_saved'] / GIB:.2f} GiB per device)")
        lines.append(f"memory: {self.budget.describe()}")
        lines.append(self.verdict())
        return "\n".join(lines)

    def verdict(self) -> str:
        peak, limit = self.peak_bytes / GIB, self.budget.limit_bytes / GIB
        if self.fits:
            return f"fits: peak {peak:.2f} of {limit:.2f} GiB (margin {self.margin_bytes / GIB:.2f} GiB)"
        return f"does NOT fit: peak {peak:.2f} GiB is {-self.margin_bytes / GIB:.2f} GiB over the {limit:.2f} GiB limit"

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["budget"] |= {"usable_bytes": self.budget.usable_bytes, "limit_bytes": self.budget.limit_bytes}
        return out | {"device_memory_bytes": self.budget.device_memory_bytes, "peak_bytes": self.peak_bytes,
                      "startup_bytes": self.startup_bytes, "margin_bytes": self.margin_bytes, "fits": self.fits}
