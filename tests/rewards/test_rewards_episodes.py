"""`episode_reward`: an episode's own reward (an environment's turns summed, or an agent's number)."""

import pytest

from rewards import make_reward


def test_episode_reward_is_each_episodes_reward():
    fn = make_reward("episode_reward")
    episodes = [{"reward": 0.5, "turns": []}, {"reward": 0, "errors": ["x"]}, {"reward": -1.25}]
    assert fn(["p"] * 3, ["a", "b", "c"], episode=episodes, answer=["1", "2", "3"]) == [0.5, 0.0, -1.25]


def test_episode_reward_refuses_rows_that_are_not_episodes():
    fn = make_reward("episode_reward")
    with pytest.raises(ValueError, match="set rollout.environment or rollout.agent"):
        fn(["p"], ["a"])
    with pytest.raises(ValueError, match="got 1 episodes for 2 completions"):
        fn(["p", "q"], ["a", "b"], episode=[{"reward": 1.0}])
    with pytest.raises(ValueError, match="not a finite number"):
        fn(["p"], ["a"], episode=[{"reward": float("nan")}])
