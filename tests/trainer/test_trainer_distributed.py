"""trainer.distributed: which launches join a multi-process run, and launch mistakes caught up front."""

import pytest
from rl_core.config import ConfigError

from trainer.distributed import Launch, launch_from


def test_no_options_and_no_environment_is_one_process():
    assert launch_from(None, None, None, False, env={}) == Launch()
    assert not Launch().joins


def test_options_win_over_the_environment_and_the_environment_fills_the_rest():
    env = {"JAX_COORDINATOR_ADDRESS": "h0:1234", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    assert launch_from(None, None, None, False, env=env) == Launch(coordinator="h0:1234", num_processes=4, process_id=3)
    assert launch_from("h1:99", None, 1, False, env=env) == Launch(coordinator="h1:99", num_processes=4, process_id=1)
    assert launch_from("h1:99", None, 1, False, env=env).joins


def test_distributed_lets_jax_detect_the_cluster():
    launch = launch_from(None, None, None, True, env={})
    assert launch.joins and launch.auto and launch.coordinator is None


def test_a_partial_launch_says_what_is_missing():
    with pytest.raises(ConfigError, match=r"needs the coordinator address.*got 'h0:1', None, 0"):
        launch_from("h0:1", None, 0, False, env={})
    with pytest.raises(ConfigError, match=r"JAX_NUM_PROCESSES='two': must be an integer"):
        launch_from("h0:1", None, 0, False, env={"JAX_NUM_PROCESSES": "two"})
    with pytest.raises(ConfigError, match=r"--process-id = 2: must be in \[0, 2\)"):
        launch_from("h0:1", 2, 2, False, env={})
