"""rl_core.config: every rule names the field, the value and the rule; dict round trips."""

import dataclasses
import math

import pytest

from rl_core.config import AlgorithmConfig, Config, ConfigError, MeshConfig, RolloutConfig, TrainingConfig
from rl_core.testing import ToyConfig

# (config class, extra valid kwargs, field, bad value, the rule's text)
RULES = [
    (RolloutConfig, {}, "max_prompt_tokens", 0, "must be >= 1"),
    (RolloutConfig, {}, "max_new_tokens", 0, "must be >= 1"),
    (RolloutConfig, {}, "temperature", -0.5, "must be >= 0 (0 = greedy)"),
    (RolloutConfig, {}, "temperature", float("nan"), "must be a finite number"),
    (RolloutConfig, {}, "top_k", -1, "must be >= 0 (0 = off)"),
    (RolloutConfig, {}, "top_p", 0.0, "must be in (0, 1]"),
    (RolloutConfig, {}, "top_p", 1.5, "must be in (0, 1]"),
    (RolloutConfig, {}, "logprob_chunk_tokens", 0, "must be >= 1"),
    (RolloutConfig, {}, "seed", -1, "must be in [0, 2**32)"),
    (RolloutConfig, {}, "engine", "sglang", "unknown engine 'sglang'. Known: paged, static (from rl-core)"),
    # an engine's own settings (rollout.options), checked by the settings class its record names
    (RolloutConfig, {"engine": "paged"}, "options", {"page_size": -1}, "PagedSettings.page_size = -1: must be >= 0"),
    (RolloutConfig, {"engine": "paged"}, "options", {"slots": 0}, "PagedSettings.slots = 0: must be >= 1"),
    (RolloutConfig, {"engine": "paged"}, "options", {"prefill_chunk": 0}, "PagedSettings.prefill_chunk = 0"),
    (RolloutConfig, {"engine": "paged"}, "options", {"steps_per_sync": 0}, "PagedSettings.steps_per_sync = 0"),
    (RolloutConfig, {"engine": "paged"}, "options", {"num_pages": -1}, "must be >= 0 (0 = sized for the batch)"),
    (RolloutConfig, {"engine": "paged"}, "options", {"attention": "flash"},
     "must be one of ('auto', 'reference', 'pallas')"),
    (RolloutConfig, {"engine": "paged"}, "options", {"slot": 4}, "has no setting 'slot'; did you mean 'slots'?"),
    (RolloutConfig, {"engine": "static"}, "options", {"slots": 4}, "rollout.engine='static' has no setting 'slots'"),
    (RolloutConfig, {"engine": "paged"}, "options", [1], "must be a mapping of the engine's settings"),
    (RolloutConfig, {"engine": "remote"}, "options", {"local_servers": -1}, "RemoteSettings.local_servers = -1"),
    (RolloutConfig, {"engine": "remote"}, "options", {"servers": ("10.0.0.2:8000",)}, "must be base URLs"),
    (RolloutConfig, {"engine": "remote"}, "options", {"max_lag": -1}, "must be an integer >= 0"),
    (RolloutConfig, {"engine": "vllm"}, "options", {"local_servers": 2}, "'vllm' has no setting 'local_servers'"),
    (RolloutConfig, {"engine": "vllm"}, "options", {"weights_url": "s3://bucket/w"}, "must be a folder"),
    (RolloutConfig, {}, "weights_dtype", "float16", "must be one of (None, 'bfloat16')"),
    (RolloutConfig, {"engine": "paged"}, "partial_rollouts", "always",
     "must be one of ('off', 'continue', 'recompute')"),
    (RolloutConfig, {}, "partial_rollouts", "continue",
     "rollout.engine='static' does not (engines that do: paged, remote)"),
    (RolloutConfig, {}, "max_turns", 0, "must be >= 1"),
    (RolloutConfig, {}, "max_turns", 2, "more than one turn needs an environment"),
    (RolloutConfig, {}, "max_turn_tokens", 17, "must be in [0, max_new_tokens = 16]"),
    (RolloutConfig, {}, "environment", "calculater", "unknown environment 'calculater'"),
    (RolloutConfig, {}, "environment_options", [1], "must be a mapping"),
    (RolloutConfig, {"engine": "paged"}, "agent", "agents.py", "must be module:function or file.py:function"),
    (RolloutConfig, {"engine": "paged", "agent": "a:b"}, "agent_timeout_s", 0.0, "must be > 0"),
    (RolloutConfig, {"engine": "remote"}, "agent", "a:b", "rollout.engine='remote' is not (engines that are: paged)"),
    (TrainingConfig, {}, "optimizer", "adamww", "must be one of ('adamw', 'adam', 'sgd')"),
    (TrainingConfig, {}, "async_rollout", "two_steps", "must be one of ('off', 'one_step')"),
    (TrainingConfig, {"async_rollout": "one_step"}, "rollout_devices", -1, "must be >= 0"),
    (TrainingConfig, {}, "rollout_devices", 2, "needs async_rollout='one_step'"),
    (TrainingConfig, {"async_rollout": "one_step"}, "max_staleness", 0, "must be an integer >= 1"),
    (TrainingConfig, {}, "max_staleness", 2, "needs async_rollout='one_step'"),
    (TrainingConfig, {}, "packing", "yes", "must be true or false"),
    (TrainingConfig, {}, "share_prompts", "yes", "must be true or false"),
    (TrainingConfig, {}, "learning_rate", 0.0, "must be > 0"),
    (TrainingConfig, {}, "learning_rate", -1e-3, "must be > 0"),
    (TrainingConfig, {}, "lr_schedule", "exponential", "must be one of ('constant', 'cosine', 'linear')"),
    (TrainingConfig, {}, "warmup_steps", -1, "must be >= 0"),
    (TrainingConfig, {}, "weight_decay", -0.1, "must be >= 0"),
    (TrainingConfig, {"optimizer": "sgd"}, "weight_decay", 0.1, "needs optimizer='adamw'"),
    (TrainingConfig, {}, "max_grad_norm", 0.0, "must be > 0 or None"),
    (TrainingConfig, {}, "prompts_per_step", 0, "must be >= 1"),
    (TrainingConfig, {}, "mini_batch_size", 0, "must be >= 1"),
    (TrainingConfig, {}, "micro_batch_size", 0, "must be >= 1"),
    (TrainingConfig, {"mini_batch_size": 8}, "micro_batch_size", 3, "must divide mini_batch_size (8)"),
    (TrainingConfig, {}, "num_steps", 0, "must be >= 1"),
    (TrainingConfig, {}, "checkpoint_every_steps", -2, "must be >= 0"),
    (TrainingConfig, {}, "samples_per_step", -1, "must be >= 0"),
    (TrainingConfig, {}, "loggers", ("tensorboard", "wandbb"), "must be a list of ('tensorboard', 'wandb', 'mlflow', 'trackio')"),
    (TrainingConfig, {}, "console_samples", "yes", "must be one of ('auto', 'always', 'never')"),
    (TrainingConfig, {}, "console_samples_every_steps", 0, "must be >= 1"),
    (TrainingConfig, {}, "log_every_steps", 0, "must be >= 1"),
    (TrainingConfig, {}, "max_checkpoints_to_keep", 0, "must be >= 1"),
    (TrainingConfig, {}, "on_nonfinite", "ignore", "must be one of ('skip', 'stop')"),
    (TrainingConfig, {}, "max_skipped_in_a_row", -1, "must be >= 0 (0 = never stop)"),
    (TrainingConfig, {}, "seed", -1, "must be in [0, 2**32)"),
    (ToyConfig, {}, "group_size", 1, "must be >= 2"),
    (MeshConfig, {}, "data", 0, "must be >= 1 or -1 (all remaining devices)"),
    (MeshConfig, {}, "tensor", -2, "must be >= 1 or -1 (all remaining devices)"),
    (MeshConfig, {}, "fsdp", 0, "must be >= 1 or -1 (all remaining devices)"),
    (MeshConfig, {}, "expert", 0, "must be >= 1 or -1 (all remaining devices)"),
    (MeshConfig, {}, "data", -1, "at most one axis may be -1, got ['data', 'fsdp']"),
]


@pytest.mark.parametrize(
    ("cls", "extra", "field", "value", "rule"),
    RULES,
    ids=[f"{r[0].__name__}.{r[2]}={r[3]!r}" for r in RULES],
)
def test_every_rule_names_field_value_and_rule(cls, extra, field, value, rule):
    cls(**extra)  # the rest of the config is valid
    with pytest.raises(ConfigError) as info:
        cls(**extra, **{field: value})
    message = str(info.value)
    assert message.startswith(f"{cls.__name__}.{field} = {value!r}: ")  # the field and the value
    assert rule in message  # the rule


def test_every_validated_field_has_a_rule_in_the_table():
    """A new field with a rule gets a row above (fields without rules are listed here)."""
    without_rules = {"mesh"}  # mesh: a nested MeshConfig with its own rows
    for cls in (RolloutConfig, TrainingConfig, MeshConfig):
        covered = {r[2] for r in RULES if r[0] is cls}
        fields = {f.name for f in dataclasses.fields(cls)} - without_rules
        assert fields == covered, f"{cls.__name__}: fields without a tested rule {fields - covered}"


def test_mesh_shape_fills_in_the_remaining_devices_and_must_use_them_all():
    assert MeshConfig().shape(8) == (1, 8, 1, 1)  # the default: everything FSDP; (data, fsdp, expert, tensor)
    assert MeshConfig(tensor=2).shape(8) == (1, 4, 1, 2)
    assert MeshConfig(data=-1, fsdp=2, tensor=2).shape(8) == (2, 2, 1, 2)
    assert MeshConfig(data=2, fsdp=2, tensor=2).shape(8) == (2, 2, 1, 2)
    assert MeshConfig(expert=4, tensor=2).shape(8) == (1, 1, 4, 2)
    assert MeshConfig(expert=4, tensor=2).row_devices(8) == 4  # rows split over data x fsdp x expert
    assert TrainingConfig.from_dict({"mesh": {"fsdp": 4, "tensor": 2}}).mesh.shape(8) == (1, 4, 1, 2)
    with pytest.raises(ConfigError, match="needs a multiple of 3 devices, but 8 are available"):
        MeshConfig(tensor=3).shape(8)
    with pytest.raises(ConfigError, match="needs 4 devices, but 8 are available"):
        MeshConfig(data=2, fsdp=2, tensor=1).shape(8)


def test_batch_layout_divides_and_reports_the_rule():
    assert TrainingConfig(mini_batch_size=8, micro_batch_size=2).batch_layout(16) == (2, 4)
    assert TrainingConfig().batch_layout(16) == (1, 1)
    with pytest.raises(ConfigError, match=r"mini_batch_size = 8: must divide the completions per step \(12\)"):
        TrainingConfig(mini_batch_size=8).batch_layout(12)
    with pytest.raises(ConfigError, match=r"micro_batch_size = 4: must divide mini_batch_size \(6\)"):
        TrainingConfig(micro_batch_size=4).batch_layout(6)


def test_configs_are_frozen_and_keyword_only():
    config = TrainingConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.learning_rate = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        RolloutConfig(64)  # type: ignore[misc]


@pytest.mark.parametrize(
    "config",
    [
        RolloutConfig(max_prompt_tokens=32, temperature=0.7, top_k=5, top_p=0.9, seed=3),
        TrainingConfig(optimizer="sgd", max_grad_norm=None, mini_batch_size=8, micro_batch_size=4),
        ToyConfig(loss_agg_mode="seq-mean-token-mean", group_size=3, inject_nan=True),
        AlgorithmConfig(loss_agg_mode="seq-mean-token-sum-norm"),
    ],
    ids=lambda c: type(c).__name__,
)
def test_from_dict_round_trip(config):
    data = config.to_dict()
    assert type(config).from_dict(data) == config
    assert type(config).from_dict({}) == type(config)()  # every field has a default


@dataclasses.dataclass(frozen=True, kw_only=True)
class Nested(Config):
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    training: TrainingConfig | None = None


def test_from_dict_builds_nested_configs_and_validates_them():
    nested = Nested.from_dict({"rollout": {"temperature": 0.5}, "training": {"num_steps": 3}})
    assert nested.rollout == RolloutConfig(temperature=0.5)
    assert nested.training == TrainingConfig(num_steps=3)
    assert Nested.from_dict(nested.to_dict()) == nested
    with pytest.raises(ConfigError, match=r"RolloutConfig.top_p = 2.0: must be in \(0, 1\]"):
        Nested.from_dict({"rollout": {"top_p": 2.0}})


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError) as info:
        TrainingConfig.from_dict({"learning_rat": 1e-4})
    message = str(info.value)
    assert "TrainingConfig has no field 'learning_rat'" in message
    assert "did you mean 'learning_rate'?" in message
    with pytest.raises(ConfigError, match="RolloutConfig has no field 'temprature'; did you mean 'temperature'"):
        Nested.from_dict({"rollout": {"temprature": 0.5}})


def test_from_dict_checks_scalar_types_and_parses_numeric_strings():
    # YAML reads 1e-3 as a string; float fields accept it, ints widen to float
    assert TrainingConfig.from_dict({"learning_rate": "1e-3", "weight_decay": 1}) == TrainingConfig(
        learning_rate=1e-3, weight_decay=1.0
    )
    with pytest.raises(ConfigError, match=r"TrainingConfig.num_steps = 'ten': must be int, got str"):
        TrainingConfig.from_dict({"num_steps": "ten"})
    with pytest.raises(ConfigError, match=r"TrainingConfig.max_grad_norm = 'x': must be float or null"):
        TrainingConfig.from_dict({"max_grad_norm": "x"})
    with pytest.raises(ConfigError, match=r"Nested.rollout = False: must be a mapping of settings"):
        Nested.from_dict({"rollout": False})


def test_loss_agg_mode_typo_fails_at_construction_with_the_close_match():
    with pytest.raises(ConfigError) as info:
        AlgorithmConfig(loss_agg_mode="token-maen")
    message = str(info.value)
    assert "AlgorithmConfig.loss_agg_mode = 'token-maen'" in message
    assert "Did you mean 'token-mean'?" in message
    with pytest.raises(ConfigError, match="token-mean"):
        ToyConfig(loss_agg_mode="token-maen")  # a subclass runs the parent's check


def test_derive_with_replace_revalidates():
    config = RolloutConfig()
    assert dataclasses.replace(config, temperature=0.0).temperature == 0.0
    with pytest.raises(ConfigError, match="max_new_tokens = -1"):
        dataclasses.replace(config, max_new_tokens=-1)


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan])
@pytest.mark.parametrize(("cls", "field"), [(TrainingConfig, "learning_rate"), (RolloutConfig, "temperature")])
def test_non_finite_numbers_are_rejected_however_the_config_is_built(cls, field, value):
    # inf passes `learning_rate > 0` and NaN passes `not temperature < 0`-style rules
    with pytest.raises(ConfigError, match=rf"{cls.__name__}\.{field} = {value!r}: must be a finite number"):
        cls(**{field: value})


def test_old_engine_keys_are_read_into_the_engines_options_with_a_one_line_notice():
    """`rollout.decode_slots`, `rollout.servers`, ... (before engines carried their settings) still work
    for one release: each is read as its `rollout.options` key, with a notice naming the new spelling."""
    with pytest.warns(FutureWarning) as notices:
        paged = RolloutConfig.from_dict({"engine": "paged", "decode_slots": 8, "page_size_tokens": 32})
    assert [str(n.message) for n in notices] == [
        "rollout.page_size_tokens is deprecated: write rollout.options.page_size (read for one more release)",
        "rollout.decode_slots is deprecated: write rollout.options.slots (read for one more release)"]
    assert paged.options == {"page_size": 32, "slots": 8} and paged.engine_settings().slots == 8
    with pytest.warns(FutureWarning) as notices:
        remote = RolloutConfig.from_dict({"engine": "remote", "servers": ["http://10.0.0.2:8000/v1"],
                                          "server_max_lag": 1})
    assert "rollout.server_max_lag is deprecated: write rollout.options.max_lag" in str(notices[1].message)
    settings = remote.engine_settings()
    assert settings.servers == ("http://10.0.0.2:8000/v1",) and settings.max_lag == 1
    # the paged engine's knobs given for an engine without them were ignored before, and still are
    with pytest.warns(FutureWarning, match="rollout.decode_slots is deprecated and ignored: rollout.engine='static'"):
        assert RolloutConfig.from_dict({"engine": "static", "decode_slots": 8}).options == {}
    # a server's setting for an engine without servers was refused before, and still is
    with pytest.warns(FutureWarning), pytest.raises(ConfigError, match="'static' has no setting 'servers'"):
        RolloutConfig.from_dict({"engine": "static", "servers": ["http://10.0.0.2:8000/v1"]})
    with pytest.raises(ConfigError, match=r"rollout.decode_slots \(deprecated\) and rollout.options.slots are both"):
        RolloutConfig.from_dict({"engine": "paged", "decode_slots": 8, "options": {"slots": 4}})
    # what a run records is the new spelling
    assert "decode_slots" not in paged.to_dict() and paged.to_dict()["options"] == {"page_size": 32, "slots": 8}


def test_old_engine_keys_at_their_old_defaults_say_nothing():
    """Every run folder an older release wrote holds every engine setting at the top of `rollout`:
    at their defaults they are dropped quietly (this suite turns a notice into an error)."""
    old = {"decode_slots": 64, "page_size_tokens": 16, "prefill_chunk_tokens": 64, "steps_per_sync": 8,
           "kv_pages": 0, "attention": "auto", "servers": [], "local_servers": 0, "weights_url": None,
           "server_max_lag": 0}
    assert RolloutConfig.from_dict({"engine": "static", **old}).options == {}
    paged = RolloutConfig.from_dict({"engine": "paged", **old})
    assert paged.options == {} and paged.engine_settings() == RolloutConfig(engine="paged").engine_settings()
