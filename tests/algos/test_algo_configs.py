"""GRPOConfig, DrGRPOConfig, DAPOConfig: rules at construction, inherited checks,
choice typos, documented fields, and the dict round trip (with DAPO's nested overlong)."""

import ast
import dataclasses
import inspect
import json
import textwrap

import pytest

from algo_dapo import DAPOConfig, OverlongConfig
from algo_dr_grpo import DrGRPOConfig
from algo_grpo import GRPOConfig
from rl_core.config import ConfigError

CONFIGS = [GRPOConfig, DrGRPOConfig, DAPOConfig]


@pytest.mark.parametrize(
    ("field", "value", "rule"),
    [
        ("group_size", 1, "must be >= 2"),
        ("num_iterations", 0, "must be >= 1"),
        ("beta", -0.01, "must be >= 0"),
        ("epsilon_low", 1.5, "must be in [0, 1] (1 = no lower bound)"),
        ("epsilon_low", -0.1, "must be in [0, 1] (1 = no lower bound)"),
        ("tis_cap", 0.5, "must be >= 1 or None (off)"),
        ("epsilon_high", -0.2, "must be >= 0"),
        ("dual_clip", 1.0, "must be > 1 or None"),
    ],
)
@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_each_rule_names_field_value_and_rule(cls, field, value, rule):
    # Subclasses run the parent's checks: the message names the subclass.
    with pytest.raises(ConfigError) as info:
        cls(**{field: value})
    assert str(info.value) == f"{cls.__name__}.{field} = {value!r}: {rule}"


@pytest.mark.parametrize(
    ("field", "typo", "suggestion"),
    [
        ("kl_estimator", "k4", None),  # no close match: the known names are listed
        ("advantage_estimator", "grpoo", "grpo"),
        ("policy_loss", "grpo_loss", "grpo"),
        ("loss_agg_mode", "token_mean", "token-mean"),
    ],
)
@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_choice_typos_fail_at_construction(cls, field, typo, suggestion):
    with pytest.raises(ConfigError) as info:
        cls(**{field: typo})
    message = str(info.value)
    assert message.startswith(f"{cls.__name__}.{field} = {typo!r}: ")
    if suggestion is None:
        assert "Known: k1, k2, k3" in message
    else:
        assert message.endswith(f"Did you mean {suggestion!r}?")


def test_dapo_keeps_grpo_checks_and_adds_its_own():
    with pytest.raises(ConfigError, match=r"^DAPOConfig\.group_size = 1: must be >= 2$"):
        DAPOConfig(group_size=1)
    with pytest.raises(ConfigError, match=r"^DAPOConfig\.max_gen_batches = 0: must be >= 1$"):
        DAPOConfig(max_gen_batches=0)
    rule = r"DAPOConfig\.on_max_gen_batches = 'drop': must be one of \('partial', 'raise'\)"
    with pytest.raises(ConfigError, match=rule):
        DAPOConfig(on_max_gen_batches="drop")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "OverlongConfig.max_tokens = 0: must be >= 1 or None"),
        ({"cache_tokens": 0}, "OverlongConfig.cache_tokens = 0: must be >= 1 or None"),
        ({"max_tokens": 8, "cache_tokens": 9}, "OverlongConfig.cache_tokens = 9: must be <= max_tokens (8)"),
        ({"penalty_factor": -1.0}, "OverlongConfig.penalty_factor = -1.0: must be >= 0"),
    ],
)
def test_overlong_rules(kwargs, message):
    with pytest.raises(ConfigError) as info:
        OverlongConfig(**kwargs)
    assert str(info.value) == message
    # and nested in DAPOConfig.from_dict
    with pytest.raises(ConfigError, match="OverlongConfig"):
        DAPOConfig.from_dict({"overlong": kwargs})


def test_defaults_of_each_algorithm():
    grpo, dr, dapo = GRPOConfig(), DrGRPOConfig(), DAPOConfig()
    assert (grpo.beta, grpo.kl_estimator, grpo.epsilon_low, grpo.epsilon_high) == (0.04, "k3", 0.2, 0.2)
    assert (grpo.loss_agg_mode, grpo.advantage_estimator, grpo.policy_loss) == ("seq-mean-token-mean", "grpo", "grpo")
    assert (grpo.dual_clip, grpo.mask_truncated_completions, grpo.num_iterations) == (None, False, 1)
    assert (dr.advantage_estimator, dr.loss_agg_mode, dr.beta) == ("dr_grpo", "seq-mean-token-sum-norm", 0.0)
    assert (dapo.epsilon_low, dapo.epsilon_high, dapo.beta, dapo.loss_agg_mode) == (0.2, 0.28, 0.0, "token-mean")
    assert dapo.dynamic_sampling and dapo.on_max_gen_batches == "partial" and dapo.max_gen_batches >= 1
    assert dapo.overlong == OverlongConfig() and dapo.overlong.enabled


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_frozen_and_keyword_only(cls):
    cfg = cls()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.beta = 0.5  # type: ignore[misc]
    with pytest.raises(TypeError):
        cls(8)  # type: ignore[misc]
    # derived, not mutated
    derived = dataclasses.replace(cfg, group_size=4)
    assert derived.group_size == 4 and cfg.group_size == 8
    with pytest.raises(ConfigError, match="group_size = 1"):
        dataclasses.replace(cfg, group_size=1)


@pytest.mark.parametrize(
    "cfg",
    [
        GRPOConfig(),
        GRPOConfig(group_size=4, beta=0.1, kl_estimator="k1", dual_clip=3.0, mask_truncated_completions=True),
        DrGRPOConfig(num_iterations=2, advantage_estimator="rloo"),
        DAPOConfig(),
        DAPOConfig(
            max_gen_batches=7,
            on_max_gen_batches="raise",
            overlong=OverlongConfig(enabled=False, max_tokens=10, cache_tokens=3, penalty_factor=0.5),
        ),
    ],
    ids=["grpo", "grpo-custom", "dr_grpo", "dapo", "dapo-custom"],
)
def test_round_trip_through_dict_and_json(cfg):
    data = cfg.to_dict()
    assert cfg.from_dict(data) == cfg
    again = type(cfg).from_dict(json.loads(json.dumps(data)))
    assert again == cfg
    if isinstance(cfg, DAPOConfig):
        assert isinstance(data["overlong"], dict)
        assert isinstance(again.overlong, OverlongConfig)
        assert data["overlong"] == dataclasses.asdict(cfg.overlong)


def test_from_dict_rejects_unknown_keys_with_the_closest_one():
    with pytest.raises(ConfigError, match=r"GRPOConfig has no field 'betta'; did you mean 'beta'\?"):
        GRPOConfig.from_dict({"betta": 0.1})
    with pytest.raises(ConfigError, match=r"OverlongConfig has no field 'cache_token'; did you mean 'cache_tokens'\?"):
        DAPOConfig.from_dict({"overlong": {"cache_token": 3}})
    with pytest.raises(ConfigError, match=r"GRPOConfig\.group_size = 1"):
        GRPOConfig.from_dict({"group_size": 1})


def _documented_fields(cls) -> set[str]:
    """Fields declared in `cls`'s own body and followed by an attribute docstring."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    out = set()
    for stmt, nxt in zip(body, body[1:], strict=False):
        is_doc = isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str)
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and is_doc:
            out.add(stmt.target.id)
    return out


@pytest.mark.parametrize("cls", [*CONFIGS, OverlongConfig], ids=lambda c: c.__name__)
def test_every_field_is_documented_somewhere_in_the_mro(cls):
    documented = set().union(*(_documented_fields(k) for k in cls.__mro__ if dataclasses.is_dataclass(k)))
    missing = {f.name for f in dataclasses.fields(cls)} - documented
    assert not missing, f"{cls.__name__} fields without an attribute docstring: {sorted(missing)}"
