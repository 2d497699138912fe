"""The trainer's run settings as schemas: `RunSettings` and its sections (task, model, LoRA, warm
start, evaluation), each a frozen config validated at construction; the rules between sections
are `RunSettings`'s. Reading them from YAML and overrides is trainer.settings.loading's."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
from rl_core import AlgorithmConfig, check, Config, ConfigError, registry, RolloutConfig, TrainingConfig
from rl_core.run import storage
from rl_models import PRESETS
from rl_models.config import ATTENTION, REMAT, RUNTIME_FIELDS

from trainer.settings.judge import JudgeSettings
from trainer.settings.reward_audit import RewardAuditSettings
from trainer.settings.reward_functions import reward_specs
from trainer.tasks import DataError, Task, TaskError, task_factory

LONG_PROMPTS = ("drop", "error")
REMAT_AUTO = "auto"
"""model.remat's default: picked to fit the device when a run starts."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSettings(Config):
    name: str = "arithmetic"
    """A registered task (`trainer tasks` lists them: the built-in ones and every installed package's entry
    point of the group `trainer.tasks`), or your own factory as `module:function` / `path/to/file.py:function`."""
    options: dict = dataclasses.field(default_factory=dict)
    """Keyword arguments of the task's constructor, e.g. {digits: 3}."""
    long_prompts: str = "drop"
    """Prompts longer than rollout.max_prompt_tokens: "drop" them when the task is
    loaded (with a one-line count) or stop with an "error" naming the first."""

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            task_factory(self.name)
        except TaskError as e:
            raise ConfigError(f"TaskSettings.name = {self.name!r}: {e}") from None
        check(self.long_prompts in LONG_PROMPTS, self, "long_prompts", f"must be one of {LONG_PROMPTS}")
        for key, value in self.options.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"TaskSettings.options.{key} = {value!r}: must be a finite number")

    def build(self) -> Task:
        make = task_factory(self.name)
        known = task_options(self.name)
        for key in self.options if known is not None else ():
            if key not in known:
                close = difflib.get_close_matches(key, known, n=1)
                hint = f"; did you mean 'task.options.{close[0]}'?" if close else ""
                raise ConfigError(
                    f"task.options.{key}: not an option of the {self.name} task (its options: "
                    f"{', '.join(known)}){hint}"
                )
        if known and "data" in known and "data" not in self.options:
            raise ConfigError(f"task.name = {self.name!r} reads a local file: pass --data FILE (task.options.data=FILE)")
        try:
            return make(**self.options)
        except TypeError as e:  # e.g. a number where a string belongs
            raise ConfigError(f"task.options = {self.options!r}: {e}") from None
        except ValueError as e:
            if isinstance(e, DataError):  # names the file and the row
                raise
            named = known is not None and str(e).split(" ", 1)[0] in known  # "digits = 0: must be ..."
            raise ConfigError(f"task.options.{e}" if named else f"task {self.name!r}, options {self.options!r}: {e}") from None


def task_options(name: str) -> list[str] | None:
    """The keyword options of task `name`'s constructor; None when it takes any (`**options`)."""
    parameters = inspect.signature(task_factory(name)).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QUANTIZE = ("int8", "int4", "nf4")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraSettings(Config):
    rank: int = 0
    """Rank r of the low-rank adapters; 0 = no LoRA (every parameter trains)."""
    alpha: float = 16.0
    """Adapter scale numerator: a projection adds (alpha / rank) * x A B (PEFT's lora_alpha)."""
    targets: tuple[str, ...] = LORA_TARGETS
    """Projections that get adapters, matched against module paths by whole path components
    (regular expressions, e.g. [q_proj, v_proj] or ["mlp/.*"]); default: attention q/k/v/o and MLP."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(isinstance(self.rank, int) and not isinstance(self.rank, bool) and self.rank >= 0, self, "rank",
              "must be an int >= 0 (0 turns LoRA off)")
        check(self.alpha > 0, self, "alpha", "must be > 0")
        check(isinstance(self.targets, (list, tuple)) and len(self.targets) > 0
              and all(isinstance(t, str) and t for t in self.targets), self, "targets",
              "must be a non-empty list of module-path patterns, e.g. [q_proj, v_proj]")
        object.__setattr__(self, "targets", tuple(self.targets))  # YAML gives a list; frozen configs hold tuples


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSettings(Config):
    path: str | None = None
    """A Hugging Face folder (Llama 3, Qwen2/2.5, Qwen3): a local path, or a URL (gs://...) whose files are
    fetched once into the user's cache (rl-variants/models); None = a random `preset` model."""
    preset: str = "tiny"
    """An rl_models preset name (tiny, tiny_qwen2), used when `path` is None."""
    seed: int = 0
    """Seed of the initial weights of a preset model."""
    dtype: str = "float32"
    """Compute dtype (activations, matmuls, KV cache): float32 or bfloat16 (recommended on accelerators)."""
    param_dtype: str = "float32"
    """Storage dtype of the loaded model and the reference copy: float32 or bfloat16. Training
    always updates float32 master weights with float32 optimizer state."""
    remat: str | bool = REMAT_AUTO
    """What each layer keeps for the backward pass (less memory, more compute): none, full (only
    its input), dots_saveable, dots_with_no_batch_dims_saveable (projection and MLP outputs;
    attention recomputed) or offload (those in host memory). true / false mean full / none.
    auto: the least recomputation that fits the device, picked with training.micro_batch_size=auto
    when a run starts (trainer.plan.choice) and written into the run's config."""
    attention: str = "auto"
    """Attention in training and prefill: auto (cudnn on NVIDIA GPUs when the dtype and head size
    allow it, splash on TPU for sequences of 128 queries or more, xla elsewhere), xla (runs everywhere),
    cudnn (fused flash attention on NVIDIA GPUs; needs dtype bfloat16) or splash (JAX's Splash kernel
    on TPU)."""
    scan_layers: bool | None = None
    """Run the blocks as a lax.scan loop (true: compile time flat in depth) or unrolled (false:
    faster on CPU); null picks by platform: unrolled on CPU, scanned on accelerators."""
    lora: LoraSettings = dataclasses.field(default_factory=LoraSettings)
    """Low-rank adapters: with lora.rank > 0 only they train; the base is frozen."""
    quantize: str | None = None
    """Store the frozen base's block projections as int8, int4 or nf4 (QLoRA; needs lora.rank > 0)."""
    critic_path: str | None = None
    """A Hugging Face folder (a path or a URL, as `path`) to start the critic (PPO) from: its
    backbone, and a value head that starts at zero. None = the policy's starting weights (with
    LoRA: its frozen base)."""
    critic_confidence: bool = True
    """The critic (PPO) also reads how likely the policy was to write each token so far (the
    sampler's log-probs) through a small head of its own (rl_models.value); false = the plain
    scalar head, as the critics of PPO run folders written before it (set it to resume them)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.quantize is None or self.quantize in QUANTIZE, self, "quantize", f"must be null or one of {QUANTIZE}")
        check(self.quantize is None or self.lora.rank > 0, self, "quantize",
              "quantizes the frozen base of a LoRA run: set model.lora.rank > 0 too")
        for name in ("dtype", "param_dtype"):
            check(getattr(self, name) in ("float32", "bfloat16"), self, name, "must be float32 or bfloat16")
        if isinstance(self.remat, bool):  # the boolean setting of earlier versions (run folders keep it)
            object.__setattr__(self, "remat", "full" if self.remat else "none")
        check(self.remat in (*REMAT, REMAT_AUTO), self, "remat",
              f"must be one of {', '.join(REMAT)}, {REMAT_AUTO} (or true / false)")
        check(self.attention in ATTENTION, self, "attention", f"must be one of {', '.join(ATTENTION)}")
        check(self.attention != "cudnn" or self.dtype == "bfloat16", self, "attention",
              "cudnn attention needs model.dtype=bfloat16")
        check(self.scan_layers is None or isinstance(self.scan_layers, bool), self, "scan_layers",
              "must be true, false or null (by platform)")
        for name in ("path", "critic_path"):
            folder = getattr(self, name)
            if storage.is_url(folder):  # fetched when loaded (trainer.model_folders.model_folder)
                try:
                    storage.filesystem(folder)
                except storage.StorageError as e:
                    raise ConfigError(f"ModelSettings.{name}: {e}") from None
            else:
                check(folder is None or Path(folder).is_dir(), self, name, "must be an existing folder or a URL")
        check(self.critic_path is None or not self.lora.rank, self, "critic_path",
              "a LoRA critic trains adapters over the policy's own frozen base; unset it or set model.lora.rank=0")
        check(self.path is not None or self.preset in PRESETS, self, "preset", f"must be one of {sorted(PRESETS)}")
        check(0 <= self.seed < 2**32, self, "seed", "must be in [0, 2**32)")

    def runtime(self) -> dict[str, Any]:
        """The model settings that say how it runs (rl_models.config.RUNTIME_FIELDS). remat=auto not yet
        picked (a model that is evaluated, served or exported: nothing runs backward) keeps everything."""
        out = {field: getattr(self, field) for field in RUNTIME_FIELDS}
        return out | ({"remat": "none"} if self.remat == REMAT_AUTO else {})


@dataclasses.dataclass(frozen=True, kw_only=True)
class WarmStartSettings(Config):
    steps: int | None = None
    """Supervised steps on the task's teacher completions before RL; None = 800 for a
    preset model, 0 for a loaded one (it is already a policy)."""
    batch_size: int = 64
    """Sequences per supervised step."""
    learning_rate: float = 3e-3
    """Adam learning rate of the warm start."""
    checkpoint_every_steps: int = 100
    """Save the warm start's state this often, so a killed run continues it rather than redoing it."""
    data: str | None = None
    """Supervised fine-tuning rows (any shape of docs/bring-your-own-task.md with a reference, e.g.
    conversations whose final assistant turn is the target): the warm start trains on them instead of
    the task's references, the loss on the reference's tokens only; None: the task's."""
    packing: bool | None = None
    """Pack each step's sequences into as few rows as fit (positions and attention restart at each
    sequence: the same loss on fewer rows, less padding computed); None: on with `data`, off for the task's
    references (which are alike in length)."""
    share: float | None = None
    """Share of the task's training rows the warm start imitates, kept apart from the RL prompts (the rest), so
    that RL does not start on rows whose answers the base policy has memorised; None: the task's choice
    (half for rows of your own, `--data`; all for the generated tasks, too many to memorise). 1.0: all, as RL's."""
    row_tokens: int | None = None
    """Width of a packed row in tokens; None: the longest sequence a row may hold (the prompts' width plus
    rollout.max_new_tokens), never less. Wider rows hold more short sequences each (fewer rows a step)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.packing is None or isinstance(self.packing, bool), self, "packing", "must be true, false or null")
        check(self.row_tokens is None or (isinstance(self.row_tokens, int) and self.row_tokens >= 1), self,
              "row_tokens", "must be an int >= 1 or null")
        check(self.steps is None or self.steps >= 0, self, "steps", "must be >= 0 or None")
        check(self.share is None or (isinstance(self.share, (int, float)) and 0 < self.share <= 1), self, "share",
              "must be in (0, 1] or null")
        check(self.share is None or self.data is None, self, "share",
              "splits the task's own rows; with warm_start.data the warm start reads that file's rows: unset one")
        check(self.checkpoint_every_steps >= 1, self, "checkpoint_every_steps", "must be >= 1")
        check(self.batch_size >= 1, self, "batch_size", "must be >= 1")
        check(self.learning_rate > 0, self, "learning_rate", "must be > 0")

    @property
    def packs(self) -> bool:
        """Whether the warm start packs its rows (`packing`, resolved)."""
        return self.data is not None if self.packing is None else self.packing


EVAL_SET_KEYS = ("data", "reward", "split", "size")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSettings(Config):
    every_steps: int = 50
    """Held-out greedy accuracy every this many steps (0 = only before and after)."""
    heldout_size: int | None = None
    """Held-out problems to use (None = all of the task's held-out split)."""
    pass_k: int = 4
    """k of pass@k in the final evaluation."""
    samples_per_prompt: int = 8
    """n samples per prompt for the unbiased pass@k estimate."""
    sets: dict = dataclasses.field(default_factory=dict)
    """More evaluation sets, by name, each {data: FILE, reward: ..., split: ..., size: N}: greedy accuracy on
    their rows (any shape; the first `size`) at every scheduled evaluation, logged as eval/<name>/accuracy."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.every_steps >= 0, self, "every_steps", "must be >= 0")
        for name, entry in self.sets.items():
            check(isinstance(name, str) and name.replace("-", "_").isidentifier(), self, "sets",
                  f"{name!r}: a set's name is letters, digits, - and _ (it names metrics)")
            check(isinstance(entry, Mapping) and isinstance(entry.get("data"), str), self, "sets",
                  f"{name}: must be a mapping with data: FILE (and optionally {', '.join(EVAL_SET_KEYS[1:])})")
            unknown = [key for key in entry if key not in EVAL_SET_KEYS]
            check(not unknown, self, "sets", f"{name}.{unknown[0] if unknown else ''}: not a key of an evaluation set "
                  f"(its keys: {', '.join(EVAL_SET_KEYS)})")
            size = entry.get("size")
            check(size is None or (isinstance(size, int) and not isinstance(size, bool) and size >= 1), self, "sets",
                  f"{name}.size = {size!r}: must be an int >= 1")
        check(self.heldout_size is None or self.heldout_size >= 1, self, "heldout_size", "must be >= 1")
        check(self.pass_k >= 1, self, "pass_k", "must be >= 1")
        check(self.samples_per_prompt >= self.pass_k, self, "samples_per_prompt", "must be >= pass_k")


DEFAULT_WARM_START_STEPS = 800

DEFAULT_TRAINING = {
    "learning_rate": 1e-3,
    "prompts_per_step": 32,
    "num_steps": 300,
    "max_grad_norm": 1.0,
    "checkpoint_every_steps": 100,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSettings(Config):
    algo: str = "grpo"
    """Algorithm name (`trainer algos` lists the installed ones)."""
    variant: str | None = None
    """The name `trainer compare` shows this run under (None: the algorithm's); set by a
    compare config's `variants:` section, e.g. grpo-async for GRPO with async rollouts."""
    task: TaskSettings = dataclasses.field(default_factory=TaskSettings)
    model: ModelSettings = dataclasses.field(default_factory=ModelSettings)
    warm_start: WarmStartSettings = dataclasses.field(default_factory=WarmStartSettings)
    training: TrainingConfig = dataclasses.field(default_factory=lambda: TrainingConfig(**DEFAULT_TRAINING))
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    algorithm: dict = dataclasses.field(default_factory=dict)
    """Fields of the algorithm's config class (e.g. {group_size: 8, beta: 0.0})."""
    eval: EvalSettings = dataclasses.field(default_factory=EvalSettings)
    reward_audit: RewardAuditSettings = dataclasses.field(default_factory=RewardAuditSettings)
    """Audits of each step's rewards that catch reward hacking (docs/reward-audits.md)."""
    judge: JudgeSettings = dataclasses.field(default_factory=JudgeSettings)
    """A judge model as one more reward (off until judge.path, judge.run or judge.train_steps names one): the
    same as a `rewards:` entry of kind judge named judge.name (docs/judge-rewards.md)."""
    rewards: dict = dataclasses.field(default_factory=dict)
    """Rewards added to the task's, by name: {name: {kind, function, weight, options, ...}}: a function
    (registered or your code), a remote scorer or a judge model (trainer.settings.reward_functions)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        config = self.algorithm_config()  # validates the algorithm name and its fields now
        self._check_across_fields(config)
        reward_specs(self.rewards)  # builds each (no request yet): a bad entry fails here

    def _check_across_fields(self, config: AlgorithmConfig) -> None:
        """Rules between sections, checked here so that they fail before any model loads."""
        if self.rollout.temperature <= 0:
            raise ConfigError(
                f"RolloutConfig.temperature = {self.rollout.temperature!r}: RL rollouts need temperature > 0 "
                "(greedy decoding samples the same completion for the whole group, so every advantage is 0)"
            )
        # async rollouts without algorithm.rollout_correction (or tis_cap) use token_tis at C = 2
        # (rl_core.correction_config.resolve_correction; docs/rollout-correction.md)
        if getattr(config, "distill_coef", 0):  # distillation reads a teacher (trainer.run.teacher)
            teacher = config.teacher
            check(teacher is not None, config, "distill_coef", "distillation needs algorithm.teacher: a Hugging Face "
                  "model folder or a trainer run folder (same tokenizer as the student) to distill from")
            check(storage.is_url(teacher) or Path(teacher).is_dir(), config, "teacher",
                  "must be an existing folder (a Hugging Face model or a trainer run) or a URL")
        if getattr(config, "routing_replay", "off") == "rollout" and not self.rollout.engine_record().offers.routing:
            from rl_core.rollout import offering  # what the records offer, before any engine is built

            raise ConfigError(
                f"algorithm.routing_replay = 'rollout': rollout.engine={self.rollout.engine_record().name!r} records "
                f"no routing to replay; use one that does ({', '.join(offering(lambda r: r.offers.routing))}) "
                "or algorithm.routing_replay=off"
            )
        if self.model.critic_path is not None and "critic" not in registry.get_algorithm(self.algo).learner.extra_models:
            raise ConfigError(
                f"ModelSettings.critic_path = {self.model.critic_path!r}: algorithm {self.algo!r} trains no critic; "
                "unset it, or train one that does (--algo ppo)"
            )
        completions = self.training.prompts_per_step * config.group_size
        rows = self.training.mesh.row_devices(jax.device_count() - self.training.rollout_devices)  # the mesh must fit the devices
        self.training.batch_layout(completions, devices=rows)  # rows split over (data, fsdp, expert)
        try:
            config.reward_functions(max_new_tokens=self.rollout.max_new_tokens)
        except ValueError as e:
            raise ConfigError(f"RunSettings.algorithm with rollout.max_new_tokens={self.rollout.max_new_tokens}: {e}") from None

    @property
    def name(self) -> str:
        """The variant's name in a comparison: `variant`, or the algorithm's."""
        return self.variant or self.algo

    @property
    def warm_start_steps(self) -> int:
        if self.warm_start.steps is not None:
            return self.warm_start.steps
        return 0 if self.model.path else DEFAULT_WARM_START_STEPS

    def algorithm_config(self) -> AlgorithmConfig:
        try:
            algorithm = registry.get_algorithm(self.algo)
        except registry.RegistryError as e:
            raise ConfigError(f"RunSettings.algo = {self.algo!r}: {e}") from None
        return algorithm.config.from_dict(dict(self.algorithm))

    def resolved(self) -> dict[str, Any]:
        """Every setting, with the algorithm's defaults filled in (saved beside the run)."""
        out = self.to_dict()
        out["algorithm"] = self.algorithm_config().to_dict()
        return out

