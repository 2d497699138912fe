"""The `remote` engine on real `trainer serve` processes (e2e): one killed while a step runs, its
return, and a GRPO run on two local servers against the in-process engine at the same seed."""

import json
import socket
import threading
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.sampler import SamplingParams
from rl_models.hf import load_hf_model

from trainer.cli import main
from trainer.remote import local
from trainer.remote.engine import RemoteBackend
from tolerances import approx

pytestmark = pytest.mark.e2e

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2"
T = 24
SHAPES = dict(max_prompt_tokens=16, max_new_tokens=T, slots=4, page_size=4, steps_per_sync=2, prefill_chunk=8)
PROMPTS = [[5, 17, 40], [9, 200, 31, 7, 3, 88], [11, 12], [250, 3, 4, 5], [7, 8, 9], [100, 101]]


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def requests() -> Requests:
    tokens, mask = left_pad(PROMPTS, pad_id=0, max_tokens=8)
    return Requests(tokens, mask, num_samples=2)


def test_a_killed_server_s_prompts_go_to_the_other_and_it_rejoins(tmp_path):
    ports = free_ports(2)
    try:
        urls = local.launch(HF, 2, ports=ports, **SHAPES)
        remote = RemoteBackend(urls, max_new_tokens=T, pad_id=0, weights_url=str(tmp_path))
        remote.update_weights(nnx.split(load_hf_model(HF))[1], 1)
        sampling, key = SamplingParams(temperature=1.0), jax.random.key(5)
        want = remote.generate(requests(), sampling, key)
        assert sorted(remote.sent.values()) == [3, 3]

        # kill the second server (SIGKILL) while the step's requests are out
        got = {}
        step = threading.Thread(target=lambda: got.setdefault("out", remote.generate(requests(), sampling, key)))
        step.start()
        local.FLEET[-1][0].kill()
        step.join()
        assert urls[1] in remote.down
        np.testing.assert_array_equal(got["out"].tokens, want.tokens)
        np.testing.assert_array_equal(got["out"].logp, want.logp)

        # back on its port: it rejoins at the next step, given the current weights
        local.launch(HF, 1, ports=ports[1:], **SHAPES)
        before = remote.sent[urls[1]]
        again = remote.generate(requests(), sampling, key)
        assert not remote.down and remote.served[urls[1]] == 1 and remote.sent[urls[1]] > before
        np.testing.assert_array_equal(again.tokens, want.tokens)
    finally:
        local.stop()


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_grpo_on_two_local_servers_trains_and_resumes_as_in_process(tmp_path):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1?", "answer": f"#### {a + 1}"}) + "\n" for a in range(8)))
    common = [
        "train", "--model", str(HF), "--task", "gsm8k", "--data", str(data), "--algo", "grpo", "--no-progress",
        "training.num_steps=1", "training.prompts_per_step=2", "algorithm.group_size=2", "rollout.seed=3",
        "task.options.heldout_size=2", "task.options.max_new_tokens=8", "eval.every_steps=0",
        "eval.samples_per_prompt=1", "eval.pass_k=1",
    ]  # fmt: skip
    try:  # each: one step, then the trainer again (--resume) for a second (remote: with its fleet)
        for name, engine in (("paged", ["rollout.engine=paged"]),
                             ("remote", ["rollout.engine=remote", "rollout.options.local_servers=2"])):
            assert main([*common, *engine, "--output", str(tmp_path / name)]) == 0
            assert main(["train", "--resume", str(tmp_path / name), "--no-progress", "training.num_steps=2"]) == 0
    finally:
        local.stop()
    paged, remote = metrics(tmp_path / "paged"), metrics(tmp_path / "remote")
    assert len(paged) == len(remote) >= 2
    for a, b in zip(paged, remote, strict=True):  # the same completions, rewards and updates
        names = [k for k in a if k.startswith(("train/", "rewards/total/")) and isinstance(a[k], float)]
        assert "rewards/total/mean" in names and any(k.startswith("train/") for k in names)
        for name in names:
            assert b[name] == approx(a[name], rel=1e-4, abs=1e-6), name
