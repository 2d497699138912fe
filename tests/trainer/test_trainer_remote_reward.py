"""A remote reward in a run: the `rewards:` settings section, and (e2e) a few training steps of the
tiny model scored by a real HTTP server on loopback (tests/rewards/fixtures/reward_server.py)."""

import json
import sys
from pathlib import Path

import pytest
from rl_core.config import ConfigError

from trainer.settings.reward_functions import reward_specs

sys.path.insert(0, str(Path(__file__).parents[1] / "rewards" / "fixtures"))
from reward_server import RewardServer  # noqa: E402


def test_reward_specs_by_name_weight_and_options():
    specs = reward_specs({
        "served": {"function": "remote_score", "weight": 0.5, "options": {"url": "http://127.0.0.1:1/score"}},
        "format_strict": None,  # the function named like the entry, weight 1, default options
    })
    assert [(s.name, s.weight) for s in specs] == [("served", 0.5), ("format_strict", 1.0)]
    assert specs[0].fn.__name__ == "served"  # its metrics are rewards/served/<counter>
    assert specs[0].fn.settings.url == "http://127.0.0.1:1/score"


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ({"x": {"function": "remote_scor"}}, r"rewards.x \(function 'remote_scor'\).*Did you mean 'remote_score'"),
        ({"x": {"function": "remote_score", "options": {"url": "ftp://h"}}}, r"rewards.x .*url must be an http"),
        ({"x": {"function": "remote_score", "option": {}}}, r"rewards.x.option: not a key"),
        ({"x": {"function": "gsm8k", "weight": "heavy"}}, r"rewards.x.weight = 'heavy'"),
        ({"x": {"function": "gsm8k", "options": [1]}}, r"rewards.x.options"),
        ({"a b": {"function": "gsm8k"}}, r"rewards.a b: a reward's name"),
        ({"x": 3}, r"rewards.x = 3: must be a mapping"),
    ],
)
def test_bad_entries_name_what_is_wrong(section, match):
    with pytest.raises(ConfigError, match=match):
        reward_specs(section)
