"""Frozen, keyword-only, validated configs shared by every algorithm.

Every rule is checked in `__post_init__`, before any model loads or anything
compiles, and a violation names the field, the value and the rule.
Subclasses call `super().__post_init__()` and add their own checks.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Self

from rl_core import registry


class ConfigError(ValueError):
    """A config field violates a rule."""


def check(ok: bool, config: Any, field: str, rule: str) -> None:
    """Raise `ConfigError` naming the class, field, value and rule unless `ok`."""
    if not ok:
        value = getattr(config, field, "<missing>")
        raise ConfigError(f"{type(config).__name__}.{field} = {value!r}: {rule}")


def check_registered(config: Any, field: str, category: str) -> None:
    """Choice fields are registry names; a typo fails at construction."""
    try:
        registry.get(category, getattr(config, field))
    except registry.RegistryError as e:
        raise ConfigError(f"{type(config).__name__}.{field} = {getattr(config, field)!r}: {e}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Config:
    """Base of every config: dict round trip with nested configs, finite numbers.

    Subclasses call `super().__post_init__()`: no float setting is inf or NaN,
    however the config was built (from a file, the command line or in Python).
    """

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _finite(type(self).__name__, f.name, getattr(self, f.name))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """Build from a plain dict, recursing into nested config fields.

        Unknown keys are rejected with the closest valid key.
        """
        fields = {f.name: f for f in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        kwargs = {}
        for key, value in data.items():
            if key not in fields:
                close = difflib.get_close_matches(key, list(fields), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"{cls.__name__} has no field {key!r}{hint} Valid fields: {', '.join(fields)}")
            sub = _config_type(hints[key])
            if sub is not None and isinstance(value, dict):
                kwargs[key] = sub.from_dict(value)
            else:
                kwargs[key] = _coerce(cls.__name__, key, value, hints[key])
        return cls(**kwargs)


_SCALARS = (bool, int, float, str)


def _coerce(owner: str, key: str, value: Any, hint: Any) -> Any:
    """Check a scalar against its field's type; ints widen to float, numeric strings parse.

    YAML reads `1e-3` as a string, so float fields accept numeric strings;
    anything else of the wrong type is an error naming the field.
    """
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in options:
        return None
    scalars = [o for o in options if o in _SCALARS]
    if not scalars:
        # a section (a nested config or a dict field) needs a mapping, not e.g. `overlong=false`
        sections = tuple(o for o in options if o is dict or _config_type(o) is not None)
        if sections and not isinstance(value, (dict, *sections)):
            raise ConfigError(
                f"{owner}.{key} = {value!r}: must be a mapping of settings (set its fields, e.g. {key}.<field>=...), "
                f"got {type(value).__name__}"
            )
        return value  # other containers and config objects: the class's own checks apply
    for kind in scalars:
        if type(value) is kind:
            return _finite(owner, key, value)
    if float in scalars and type(value) is int:
        return float(value)
    if float in scalars and isinstance(value, str):
        try:
            return _finite(owner, key, float(value))
        except ValueError as e:
            if isinstance(e, ConfigError):
                raise
    expected = " or ".join(o.__name__ for o in scalars) + (" or null" if type(None) in options else "")
    raise ConfigError(f"{owner}.{key} = {value!r}: must be {expected}, got {type(value).__name__}")


def _finite(owner: str, key: str, value: Any) -> Any:
    """inf and nan pass every `> 0` rule (`inf > 0`; `nan` compares false both ways
    in rules written as `not x < 0`) and end runs in NaN parameters: never a setting."""
    if type(value) is float and not math.isfinite(value):
        raise ConfigError(f"{owner}.{key} = {value!r}: must be a finite number")
    return value


def _config_type(hint: Any) -> type[Config] | None:
    """The Config subclass a field holds, if any (also through `X | None`)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if isinstance(option, type) and issubclass(option, Config):
            return option
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class AlgorithmConfig(Config):
    """Base of every algorithm's config: what the base learner needs to know."""

    group_size: int = 8
    """G: completions sampled per prompt (the policy-gradient pipeline asks >= 2, so that a group
    has a baseline, unless its estimator reads a critic)."""
    num_iterations: int = 1
    """mu: optimizer passes over each batch; > 1 computes old-policy log-probs once."""
    loss_agg_mode: str = "token-mean"
    """How per-token losses become one number: a `loss_aggregation` registry name."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.group_size >= 1, self, "group_size", "must be >= 1")
        check(self.num_iterations >= 1, self, "num_iterations", "must be >= 1")
        check_registered(self, "loss_agg_mode", "loss_aggregation")

    def reward_functions(self, *, max_new_tokens: int) -> tuple[Callable[..., list[float]], ...]:
        """Reward functions the algorithm adds to the task's (e.g. DAPO's overlong shaping).

        Each has the reward-function signature `fn(prompts, completions, **fields)`;
        whoever builds the reward manager includes them.
        """
        return ()

    def check_reward_names(self, names: Sequence[str]) -> None:
        """Rules between this config and the run's reward functions, by name (the task's and the
        algorithm's own), checked before any model loads; raises ConfigError. None by default."""


ROLLOUT_WEIGHTS_DTYPES = (None, "bfloat16")
PARTIAL_ROLLOUTS = ("off", "continue", "recompute")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RolloutConfig(Config):
    """How completions are sampled."""

    max_prompt_tokens: int = 64
    """Longest prompt in tokens, its BOS included (as `rl_core.policy.encode_prompts` counts). The
    sampler refuses a longer one; the trainer drops longer prompts when the task is loaded, or stops,
    per task.long_prompts (default drop)."""
    max_new_tokens: int = 16
    """Most tokens generated per completion (L_max)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding."""
    top_k: int = 0
    """Keep only the k most likely tokens; 0 disables. The sampler's log-probs stay those of the full
    tempered softmax (what the learner computes), so importance weights measure real mismatch."""
    top_p: float = 1.0
    """Keep the smallest set of tokens whose probability reaches p; 1.0 disables. Log-probs as for top_k."""
    seed: int = 0
    """Seed of the sampling key stream."""
    logprob_chunk_tokens: int = 64
    """Completion tokens unembedded at once when computing log-probs."""
    engine: str = "auto"
    """Rollout backend: "static" (one program, KV cache preallocated to the longest completion),
    "paged" (paged KV cache, continuous batching, own inference weights; see rl_core.rollout) or
    another engine a package registers (entry-point group rl_core.engines), or
    "auto" (the default): of the registered engines that declare a threshold, the one with the highest
    at or below max_new_tokens: paged from 512 new tokens, where it wins, static below, where it is as
    fast or faster (benchmarks/rollout_engines.py; docs/rollout-engines.md; rl_core.rollout.engines)."""
    options: dict = dataclasses.field(default_factory=dict)
    """The engine's own settings, checked by its settings class (`Engine.settings`): for "paged" its
    `PagedSettings` (e.g. options.page_size=32, options.slots=16; rl_core.rollout.paged_settings), for
    "remote" its servers and weight routes (options.servers=[urls]; docs/remote-engines.md), for
    "vllm" its servers (docs/vllm.md); "static" takes none."""
    environment: str | None = None
    """Multi-turn episodes: the registered environment (entry-point group `rl_core.environments`)
    that answers each model turn; None = one completion per sample. With an environment,
    max_new_tokens is the episode's budget after the prompt, model and observation tokens
    together (see rl_core.episodes)."""
    environment_options: dict = dataclasses.field(default_factory=dict)
    """Keyword arguments of the environment's factory."""
    agent: str | None = None
    """Agent episodes: `module:function` or `file.py:function` naming `async def agent(client, row)`,
    run G times per prompt against the policy served as an OpenAI endpoint (`client` an
    `openai.AsyncOpenAI`; see rl_core.episodes.agents and docs/agents.md). Needs an engine that serves
    agents (`Engine.serves_agents`: the paged engine); as with an environment, max_new_tokens is the
    episode's budget after its first prompt."""
    agent_timeout_s: float = 120.0
    """Wall-clock budget of one agent episode; an agent still running then ends with an error."""
    max_turns: int = 1
    """Most model turns per episode (with an environment; with an agent, most requests, 1 = unbounded)."""
    max_turn_tokens: int = 0
    """Most tokens of one model turn; 0 = max_new_tokens."""
    weights_dtype: str | None = None
    """The weights the rollout engine samples with: None = the trained parameters as they are (the
    model casts them to model.dtype where used); "bfloat16" = a bfloat16 copy of each weight version
    (half the rollout's weight memory and traffic; the sampler then differs from the trainer as a
    bfloat16 inference server does, which the rollout correction is for: docs/rollout-correction.md).
    Evaluation samples with the trained weights."""
    partial_rollouts: str = "off"
    """With async rollouts, on an engine that takes weights mid-rollout (`Engine.offers.takes_published`:
    the paged engine, in process or on servers): what a collection does when the update publishes newer
    weights while it decodes (rl_core.rollout.feed; docs/async-rollouts.md). "off": nothing, one
    weight version per collection; "continue": running sequences keep the keys and values older
    weights computed and decode on under the new ones (PipelineRL); "recompute": their keys and
    values are recomputed under the new weights first. Either way each token keeps the version
    that sampled it and its log-prob under that version (the rollout correction weighs it)."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        """As `Config.from_dict`, reading the old spellings of engine settings (rl_core.rollout.moved_keys)."""
        from rl_core.rollout.moved_keys import moved_into_options  # reads the engines' records

        return super().from_dict(moved_into_options(data))

    def engine_record(self, *, pageable: bool = True) -> Any:
        """The record of the engine this config runs (`rl_core.rollout.engines.Engine`; "auto" resolved for
        a policy with a paged adapter unless `pageable` is False)."""
        from rl_core.rollout.engines import engine_record  # the records are read when asked, not on import

        return engine_record(self.engine, self.max_new_tokens, pageable=pageable)

    def engine_settings(self, *, pageable: bool = True) -> Any:
        """Its engine's settings (an instance of `Engine.settings`) from `options`."""
        return self.engine_record(pageable=pageable).parse(self.options)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.weights_dtype in ROLLOUT_WEIGHTS_DTYPES, self, "weights_dtype",
              f"must be one of {ROLLOUT_WEIGHTS_DTYPES}")
        check(self.max_prompt_tokens >= 1, self, "max_prompt_tokens", "must be >= 1")
        check(self.max_new_tokens >= 1, self, "max_new_tokens", "must be >= 1")
        check(self.temperature >= 0.0, self, "temperature", "must be >= 0 (0 = greedy)")
        check(self.top_k >= 0, self, "top_k", "must be >= 0 (0 = off)")
        check(0.0 < self.top_p <= 1.0, self, "top_p", "must be in (0, 1]")
        check(self.logprob_chunk_tokens >= 1, self, "logprob_chunk_tokens", "must be >= 1")
        check(0 <= self.seed < 2**32, self, "seed", "must be in [0, 2**32)")
        check(self.max_turns >= 1, self, "max_turns", "must be >= 1")
        check(self.partial_rollouts in PARTIAL_ROLLOUTS, self, "partial_rollouts",
              f"must be one of {PARTIAL_ROLLOUTS}")
        check(isinstance(self.options, dict), self, "options", "must be a mapping of the engine's settings")
        # what the engine is and offers, from its record (rl_core.rollout.engines), never from its name
        from rl_core.rollout.engines import offering

        record = self.engine_record()  # an unknown engine: the registered ones and the closest
        record.parse(self.options)
        if self.partial_rollouts != "off" and not record.offers.takes_published:  # names listed only on failure
            raise ConfigError(f"RolloutConfig.partial_rollouts = {self.partial_rollouts!r}: needs an engine that takes "
                              f"weights mid-rollout; rollout.engine={record.name!r} does not (engines that do: "
                              f"{', '.join(offering(lambda r: r.offers.takes_published))})")
        check(self.max_turns == 1 or self.environment is not None or self.agent is not None, self, "max_turns",
              "more than one turn needs an environment to answer the turns (rollout.environment) or an agent")
        if self.agent is not None:
            check(self.environment is None, self, "agent", "an agent and an environment cannot both run the episodes")
            if not record.serves_agents:
                raise ConfigError(f"RolloutConfig.agent = {self.agent!r}: agent episodes need an engine served in "
                                  f"process as an OpenAI endpoint; rollout.engine={record.name!r} is not (engines "
                                  f"that are: {', '.join(offering(lambda r: r.serves_agents))})")
            check(":" in self.agent, self, "agent", "must be module:function or file.py:function")
            check(self.agent_timeout_s > 0, self, "agent_timeout_s", "must be > 0")
        check(0 <= self.max_turn_tokens <= self.max_new_tokens, self, "max_turn_tokens",
              f"must be in [0, max_new_tokens = {self.max_new_tokens}] (0 = max_new_tokens)")
        check(isinstance(self.environment_options, dict), self, "environment_options", "must be a mapping")
        if self.environment is not None:
            try:
                registry.get_environment(self.environment)
            except registry.RegistryError as e:
                raise ConfigError(f"RolloutConfig.environment = {self.environment!r}: {e}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class MeshConfig(Config):
    """The device mesh (see `rl_core.runtime.mesh`): sizes of its four axes; one may be -1,
    meaning all remaining devices. Their product must be the device count."""

    data: int = 1
    """Pure data parallelism: rows split, parameters replicated."""
    fsdp: int = -1
    """Fully sharded data parallelism: rows split, parameters and optimizer state sharded."""
    tensor: int = 1
    """Tensor parallelism: attention heads and the MLP's inner width split."""
    expert: int = 1
    """Expert parallelism: a mixture of experts' experts split (tokens sent to their experts'
    devices and back); rows split, and the other weights sharded like fsdp's."""

    AXES = ("data", "fsdp", "expert", "tensor")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in self.AXES:
            check(getattr(self, name) == -1 or getattr(self, name) >= 1, self, name, "must be >= 1 or -1 (all remaining devices)")
        free = [n for n in self.AXES if getattr(self, n) == -1]
        check(len(free) <= 1, self, free[0] if free else "data", f"at most one axis may be -1, got {free}")

    def shape(self, device_count: int) -> tuple[int, int, int, int]:
        """(data, fsdp, expert, tensor) for `device_count` devices, the -1 filled in;
        ConfigError when they do not fit."""
        sizes = {name: getattr(self, name) for name in self.AXES}
        fixed = math.prod(v for v in sizes.values() if v != -1)
        free = [k for k, v in sizes.items() if v == -1]
        if free and device_count % fixed == 0:
            sizes[free[0]] = device_count // fixed
        if math.prod(sizes.values()) != device_count:
            raise ConfigError(
                f"{type(self).__name__} {self.to_dict()}: needs {fixed if not free else f'a multiple of {fixed}'} "
                f"devices, but {device_count} are available"
            )
        return sizes["data"], sizes["fsdp"], sizes["expert"], sizes["tensor"]

    def row_devices(self, device_count: int) -> int:
        """How many ways a batch's rows are split: data x fsdp x expert (`shape` checks the fit)."""
        data, fsdp, expert, _ = self.shape(device_count)
        return data * fsdp * expert


OPTIMIZERS = ("adamw", "adam", "sgd")
SCHEDULES = ("constant", "cosine", "linear")
ON_NONFINITE = ("skip", "stop")
LOGGERS = ("tensorboard", "wandb", "mlflow", "trackio")
CONSOLE_SAMPLES = ("auto", "always", "never")
ASYNC_ROLLOUT = ("off", "one_step")
MICRO_AUTO = "auto"
"""TrainingConfig.micro_batch_size's default: picked to fit the device when a run starts."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainingConfig(Config):
    """The loop, the batch layout and the optimizer."""

    optimizer: str = "adamw"
    """One of adamw, adam, sgd (through optax)."""
    learning_rate: float = 1e-5
    """Peak learning rate."""
    lr_schedule: str = "constant"
    """constant, cosine (decay to 0 over num_steps) or linear (decay to 0)."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up from 0 to learning_rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay (adamw only)."""
    max_grad_norm: float | None = 1.0
    """Clip gradients to this global norm; None disables."""
    prompts_per_step: int = 8
    """Prompts (groups) per training step: B."""
    mini_batch_size: int | None = None
    """Completions per optimizer step; None = the whole step's batch."""
    micro_batch_size: int | str | None = MICRO_AUTO
    """Completions per gradient-accumulation chunk; None = the whole mini-batch; "auto" = as many as
    fit the device: the trainer's plan picks the number when a run starts and writes it into the
    run's config (a learner built without the trainer takes the whole mini-batch)."""
    num_steps: int = 100
    """Training steps (batches of prompts)."""
    checkpoint_every_steps: int = 0
    """Save a checkpoint every this many steps; 0 saves only at the end."""
    log_every_steps: int = 1
    """Write metrics every this many steps."""
    max_checkpoints_to_keep: int = 2
    """Older checkpoints are deleted."""
    seed: int = 0
    """Seed of the data order."""
    on_nonfinite: str = "skip"
    """A non-finite loss or gradient: skip the update and count it, or stop the run."""
    max_skipped_in_a_row: int = 10
    """With on_nonfinite='skip', stop the run when this many updates in a row were skipped: a
    spike is skipped, but weights, data or settings that make every update non-finite stop it
    with a message (0 = never stop). The count restarts on resume."""
    samples_per_step: int = 4
    """Completions written to samples.jsonl each step: the first two of each group in turn (a few
    prompts, each with completions to contrast)."""
    loggers: tuple[str, ...] = ("tensorboard",)
    """Where metrics go besides metrics.jsonl: tensorboard (scalars, the config and samples as text), wandb
    (Weights & Biases), mlflow or trackio (scalars, the config, a samples table; each needs its extra)."""
    console_samples: str = "auto"
    """A table of the step's samples (prompt, completion, each reward, advantage, length) on the console:
    auto (with the progress bar on a terminal), always (also in logs and with --no-progress), never."""
    console_samples_every_steps: int = 10
    """Print the console samples table every this many steps (and at the first)."""
    mesh: MeshConfig = dataclasses.field(default_factory=MeshConfig)
    """How the devices are arranged: data, fsdp and tensor parallelism."""
    async_rollout: str = "off"
    """off: each step samples its batch with the current weights, then trains on it. one_step:
    the batch of step n+1 is sampled (and scored) with the weights of step n-1 while step n
    trains, so generation and reward scoring overlap the update; staleness is at most one step,
    corrected by the algorithm's truncated importance weight (see rl_core.learner.base)."""
    max_staleness: int = 1
    """With async_rollout=one_step, how many batches are collected ahead (k): batch n is sampled by
    the weights of step n-1-k at the latest and trained k steps stale (rl_core.rollout.async_rollout)."""
    share_prompts: bool = True
    """Run each group's prompt once in the policy's update and log-prob passes, not once per
    completion: the prompt fills a KV cache its G rows continue from (the same log-probs and
    gradients). Applies when a micro-batch's rows on each device are whole groups with one
    prompt each, and not with packing (rl_core.train.layout)."""
    packing: bool = False
    """Pack each micro-batch's prompt+completion sequences, several per row with attention kept
    within each, into as few rows as they fit (per device on a mesh) for the policy's update and
    log-prob passes: the same losses and gradients on fewer padded positions (rl_core.train.packing)."""
    rollout_devices: int = 0
    """With async_rollout=one_step, the last N devices generate, on a mesh of their own (fsdp
    over them), and `mesh` is laid over the others: the next batch is sampled while this one
    trains on other devices. 0: rollouts share the training devices. One process only."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.async_rollout in ASYNC_ROLLOUT, self, "async_rollout", f"must be one of {ASYNC_ROLLOUT}")
        check(isinstance(self.max_staleness, int) and self.max_staleness >= 1, self, "max_staleness",
              "must be an integer >= 1")
        check(self.max_staleness == 1 or self.async_rollout != "off", self, "max_staleness",
              "needs async_rollout='one_step': synchronous rollouts sample with the current weights")
        check(isinstance(self.packing, bool), self, "packing", "must be true or false")
        check(isinstance(self.share_prompts, bool), self, "share_prompts", "must be true or false")
        check(self.rollout_devices >= 0, self, "rollout_devices", "must be >= 0")
        check(self.rollout_devices == 0 or self.async_rollout != "off", self, "rollout_devices",
              "needs async_rollout='one_step': synchronous rollouts would leave these devices idle while training")
        check(self.optimizer in OPTIMIZERS, self, "optimizer", f"must be one of {OPTIMIZERS}")
        check(self.learning_rate > 0, self, "learning_rate", "must be > 0")
        check(self.lr_schedule in SCHEDULES, self, "lr_schedule", f"must be one of {SCHEDULES}")
        check(self.warmup_steps >= 0, self, "warmup_steps", "must be >= 0")
        check(self.weight_decay >= 0, self, "weight_decay", "must be >= 0")
        check(self.weight_decay == 0 or self.optimizer == "adamw", self, "weight_decay", "needs optimizer='adamw'")
        check(self.max_grad_norm is None or self.max_grad_norm > 0, self, "max_grad_norm", "must be > 0 or None")
        check(self.prompts_per_step >= 1, self, "prompts_per_step", "must be >= 1")
        check(self.mini_batch_size is None or self.mini_batch_size >= 1, self, "mini_batch_size", "must be >= 1")
        check(self.micro_batch_size in (None, MICRO_AUTO) or (isinstance(self.micro_batch_size, int)
                                                               and self.micro_batch_size >= 1),
              self, "micro_batch_size", f"must be >= 1, null (the whole mini-batch) or {MICRO_AUTO!r}")
        if self.mini_batch_size and isinstance(self.micro_batch_size, int):
            check(
                self.mini_batch_size % self.micro_batch_size == 0,
                self,
                "micro_batch_size",
                f"must divide mini_batch_size ({self.mini_batch_size})",
            )
        check(self.num_steps >= 1, self, "num_steps", "must be >= 1")
        for name in ("checkpoint_every_steps", "samples_per_step"):
            check(getattr(self, name) >= 0, self, name, "must be >= 0")
        check(self.log_every_steps >= 1, self, "log_every_steps", "must be >= 1")
        check(self.console_samples in CONSOLE_SAMPLES, self, "console_samples", f"must be one of {CONSOLE_SAMPLES}")
        check(self.console_samples_every_steps >= 1, self, "console_samples_every_steps", "must be >= 1")
        check(self.max_checkpoints_to_keep >= 1, self, "max_checkpoints_to_keep", "must be >= 1")
        check(self.on_nonfinite in ON_NONFINITE, self, "on_nonfinite", f"must be one of {ON_NONFINITE}")
        check(0 <= self.seed < 2**32, self, "seed", "must be in [0, 2**32) (numpy's seeds)")
        check(self.max_skipped_in_a_row >= 0, self, "max_skipped_in_a_row", "must be >= 0 (0 = never stop)")
        check(isinstance(self.loggers, (list, tuple)), self, "loggers", f"must be a list of {LOGGERS}")
        object.__setattr__(self, "loggers", tuple(self.loggers))  # YAML gives a list; frozen configs hold tuples
        check(all(x in LOGGERS for x in self.loggers), self, "loggers", f"must be a list of {LOGGERS}")

    def batch_layout(self, batch_size: int, *, devices: int = 1) -> tuple[int, int]:
        """(mini-batches per iteration, micro-batches per mini-batch) for `batch_size` completions
        whose micro-batches are split over `devices`."""
        mini = self.mini_batch_size or batch_size
        micro = self.micro_batch_size if isinstance(self.micro_batch_size, int) else mini  # "auto" unpicked: whole
        if batch_size % mini:
            raise ConfigError(
                f"TrainingConfig.mini_batch_size = {mini}: must divide the completions per step ({batch_size})"
            )
        if mini % micro:
            raise ConfigError(f"TrainingConfig.micro_batch_size = {micro}: must divide mini_batch_size ({mini})")
        if micro % devices:
            raise ConfigError(
                f"TrainingConfig.micro_batch_size = {micro} completions: must divide evenly over {devices} devices; "
                "choose prompts_per_step, group size and micro_batch_size so that it does"
            )
        return batch_size // mini, mini // micro
