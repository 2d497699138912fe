"""A third rollout engine from one module and one entry point (rl_core.rollout.engines): its record
carries its own settings class and what it offers, and a run's settings are checked against the
record, never against the engine's name. Here it has a setting of its own (`rows_per_call`),
offers partial rollouts and no agents; a run trains with it."""

from __future__ import annotations

import json

import distributions
import pytest
from rl_core import registry
from rl_core.config import ConfigError, RolloutConfig
from trainer.cli import main
from trainer.settings import build_settings

THIRD_ENGINE = '''
import dataclasses

from rl_core.config import Config, check
from rl_core.rollout.capabilities import Capabilities
from rl_core.rollout.engines import STATIC, Engine

@dataclasses.dataclass(frozen=True, kw_only=True)
class ThirdSettings(Config):
    rows_per_call: int = 8
    """Rows decoded per device call."""

    def __post_init__(self):
        super().__post_init__()
        check(self.rows_per_call >= 1, self, "rows_per_call", "must be >= 1")


def build(b):
    build.given.append(b.settings)
    return STATIC.build(b)


build.given = []  # the settings each build was given


ENGINE = Engine(name="third", build=build, memory=STATIC.memory, settings=ThirdSettings,
                offers=Capabilities(keeps_reference=True, takes_published=True, routing=True))
'''

TINY = ["model.preset=tiny", "warm_start.steps=0", "training.prompts_per_step=2", "algorithm.group_size=2",
        "algorithm.beta=0.0", "rollout.max_prompt_tokens=15", "rollout.max_new_tokens=8"]


@pytest.fixture
def third_engine(tmp_path, monkeypatch):
    """A distribution `third-engine` on sys.path whose entry point declares the engine `third`, and a
    fresh process registry that discovers it as a run's would (distributions.engine_installed)."""
    site = tmp_path / "site"
    site.mkdir()
    yield from distributions.engine_installed(site, monkeypatch, "third_engine_mod", THIRD_ENGINE,
                                              "third = third_engine_mod:ENGINE\n")


def test_its_own_setting_is_checked_by_its_settings_class(third_engine):
    assert RolloutConfig(engine="third", options={"rows_per_call": 3}).engine_settings().rows_per_call == 3
    with pytest.raises(ConfigError) as info:
        build_settings(algo="grpo", overrides=[*TINY, "rollout.engine=third", "rollout.options.rows_per_call=0"])
    assert str(info.value) == ("RolloutConfig.options = {'rows_per_call': 0}: ThirdSettings.rows_per_call = 0: "
                               "must be >= 1 (rollout.engine='third')")
    with pytest.raises(ConfigError, match=r"'third' has no setting 'rows_per_cal'; did you mean 'rows_per_call'\?"):
        RolloutConfig(engine="third", options={"rows_per_cal": 3})
    with pytest.raises(ConfigError, match=r"'paged' has no setting 'rows_per_call'"):  # another engine's setting
        RolloutConfig(engine="paged", options={"rows_per_call": 3})


def test_it_takes_partial_rollouts_and_refuses_agents_as_its_record_says(third_engine):
    assert RolloutConfig(engine="third", partial_rollouts="continue").partial_rollouts == "continue"
    with pytest.raises(ConfigError, match=r"'static' does not \(engines that do: paged, remote, third\)"):
        RolloutConfig(engine="static", partial_rollouts="continue")
    with pytest.raises(ConfigError, match=r"rollout.engine='third' is not \(engines that are: paged\)"):
        RolloutConfig(engine="third", agent="agents:run")


def test_routing_replay_needs_an_engine_whose_record_offers_routing(third_engine):
    replay = [*TINY, "algorithm.routing_replay=rollout"]
    assert build_settings(algo="grpo", overrides=[*replay, "rollout.engine=third"]).rollout.engine == "third"
    with pytest.raises(ConfigError, match=r"rollout.engine='remote' records no routing to replay"):
        build_settings(algo="grpo", overrides=[*replay, "rollout.engine=remote", "rollout.options.local_servers=1"])


def test_a_run_trains_with_it_and_its_setting(third_engine, tmp_path):
    run = tmp_path / "run"
    assert main(["train", "--algo", "grpo", "--no-progress", *TINY, "training.num_steps=2",
                 "training.async_rollout=one_step", "rollout.engine=third", "rollout.options.rows_per_call=3",
                 "rollout.partial_rollouts=continue", "eval.every_steps=0", "--output", str(run)]) == 0
    built = registry.get_engine("third").build.given
    assert [type(s).__name__ for s in built] == ["ThirdSettings"] and built[0].rows_per_call == 3
    saved = json.loads((run / "settings_at_start.json").read_text())["rollout"]
    assert saved["engine"] == "third" and saved["options"] == {"rows_per_call": 3}
    assert (run / "metrics.jsonl").read_text().count("\n") >= 2  # two steps trained
