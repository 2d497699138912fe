"""Partial rollouts across engine servers (`rollout.partial_rollouts` with `rollout.engine=remote`):
weights the learner publishes while a server generates reach that generation (`RemoteBackend.publish`,
`/v1/engine/weights` with into_running), which switches at its next device call exactly as the
in-process paged engine does; every token carries the version that sampled it.

The switch is placed as in tests/rl_core/test_core_partial_rollouts.py: once the server's device
call 2 has returned, its engine thread waits until the publish (sent over HTTP from this thread)
is in its feed, so call 3 is the first under the new weights, on the server and in process alike.
"""

import json
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from rl_core.config import RolloutConfig
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.paged_settings import PagedSettings
from rl_core.rollout.sampler import SamplingParams
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model, load_hf_tokenizer

from trainer.cli import main
from trainer.remote.engine import RemoteBackend
from trainer.serve import EngineOptions, serve_in_thread, served_folder
from tolerances import close

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2"
T = 10
SWITCH = 2  # device calls under version 1 before the publish lands (2 decode steps a call)
SHAPES = dict(max_prompt_tokens=16, max_new_tokens=T, slots=4, page_size=4, steps_per_sync=2, prefill_chunk=8)
LENGTHS = dict(max_prompt_tokens=16, max_new_tokens=T)
ENGINE = PagedSettings(slots=4, page_size=4, steps_per_sync=2, prefill_chunk=8)
PROMPTS = ([5, 17, 40], [9, 200, 31, 7, 3, 88], [11, 12])
SAMPLED = SamplingParams(temperature=1.0)


def weights(scale):
    """The folder's weights scaled (what a learner publishes after an update)."""
    model = load_hf_model(HF)
    state = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x * scale, state))
    return nnx.split(model)[1]


def requests():
    tokens, mask = left_pad([list(p) for p in PROMPTS], pad_id=0, max_tokens=8)
    return Requests(tokens, mask, num_samples=2, prompt_ids=np.array([40, 41, 42]))


def switching(engine, publish):
    """Make `engine` run `publish()` once its device call SWITCH has returned and wait there until
    its feed holds the new version (the next call then switches); undo with `del engine.call`."""
    call, calls = type(engine).call.__get__(engine), [0]

    def publishing(*args):
        out = call(*args)
        calls[0] += 1
        if calls[0] == SWITCH:
            publish()
        return out

    engine.call = publishing


@pytest.fixture(scope="module")
def v1_v2():
    return weights(1.1), weights(0.9)


@pytest.mark.e2e  # a server on a thread and the in-process engine, each decoding
@pytest.mark.parametrize(("mode", "stream"), [("continue", False), ("recompute", True)])
def test_a_publish_reaches_the_generation_running_on_a_server(v1_v2, mode, stream, tmp_path):
    """Each mode, the snapshot through a folder (continue) or streamed to the server (recompute)."""
    v1, v2 = v1_v2
    served = served_folder(HF, EngineOptions(**LENGTHS, engine=ENGINE, top_logprobs=0, partial_rollouts=mode))
    running = serve_in_thread(served)
    remote = RemoteBackend([running.url], max_new_tokens=T, pad_id=0,
                           weights_url="stream" if stream else str(tmp_path), partial_rollouts=mode)
    assert remote.capabilities.takes_published
    server_engine = served.loop.engine
    reached, took = threading.Event(), []
    try:
        remote.update_weights(v1, 1)

        def on_server():  # on the server's engine thread: hand over to this thread and wait for the feed
            reached.set()
            for _ in range(6000):
                if server_engine.feed.version == 2:
                    return
                threading.Event().wait(0.01)
            raise AssertionError("the published version never reached the server's feed")

        switching(server_engine, on_server)
        out: dict = {}
        thread = threading.Thread(target=lambda: out.update(got=remote.generate(requests(), SAMPLED,
                                                                                 jax.random.key(3))))
        thread.start()
        assert reached.wait(120)
        took.append(remote.publish(v2, 2))  # over HTTP, while the server's generation runs
        thread.join(300)
        got = out["got"]
    finally:
        server_engine.__dict__.pop("call", None)
        running.stop()
        served.loop.close()
    assert took == [True] and server_engine.switches == 1 and server_engine.version == 2
    assert (tmp_path / "v2.safetensors").exists() is not stream

    # the in-process paged engine, the same publish point: the same tokens, log-probs and versions
    tokenizer = load_hf_tokenizer(HF)
    graphdef = nnx.split(load_hf_model(HF))[0]
    engine = PagedBackend(graphdef, EngineSettings(**SHAPES), paging=PAGED_TRANSFORMER,
                          eos_ids=tokenizer.eos_ids, pad_id=0, partial_rollouts=mode)
    engine.update_weights(v1, 1)
    switching(engine, lambda: engine.publish(v2, 2))
    want = engine.generate(requests(), SAMPLED, jax.random.key(3))
    mask = np.asarray(want.mask) > 0
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_array_equal(np.where(mask, got.tokens, 0), np.where(mask, want.tokens, 0))
    np.testing.assert_allclose(np.where(mask, got.logp, 0), np.where(mask, want.logp, 0), **close(atol=1e-5))
    np.testing.assert_array_equal(np.where(mask, got.token_version, 0), np.where(mask, want.token_version, 0))

    # the first 4 rows started under version 1 and switched after 4 tokens; the last 2 started after
    versions = np.where(mask, got.token_version, -1)
    mixed = [row for row in versions if {1, 2} <= set(row.tolist())]
    assert len(mixed) >= 3, versions
    for row in versions:  # 2 only after 1: each row's versions never go back
        real = row[row >= 0]
        assert (np.diff(real) >= 0).all() and set(real.tolist()) <= {1, 2}
    np.testing.assert_array_equal(got.version, np.where((versions == 1).any(axis=1), 1, 2))  # its oldest token's


@pytest.mark.e2e  # a server on a thread
def test_a_server_started_without_partial_rollouts_refuses_a_publish_into_its_generation(v1_v2, tmp_path):
    served = served_folder(HF, EngineOptions(**LENGTHS, engine=ENGINE, top_logprobs=0))
    running = serve_in_thread(served)
    try:
        off = RemoteBackend([running.url], max_new_tokens=T, pad_id=0, weights_url=str(tmp_path))
        assert not off.capabilities.takes_published and off.publish(v1_v2[1], 2) is False  # nothing written
        assert not (tmp_path / "v2.safetensors").exists()
        remote = RemoteBackend([running.url], max_new_tokens=T, pad_id=0, weights_url=str(tmp_path),
                               partial_rollouts="continue")
        remote.update_weights(v1_v2[0], 1)
        assert remote.publish(v1_v2[1], 2) is False  # nobody took it: the rollout keeps version 1
        r = remote.client.post(f"{running.url}/engine/weights",
                               json={"url": str(tmp_path / "v2.safetensors"), "version": 2, "into_running": True})
        assert r.status_code == 400
        assert "start it with --partial-rollouts continue or recompute" in r.json()["error"]["message"]
        assert remote.served_version(running.url) == 1 and remote.down == {}
    finally:
        running.stop()
        served.loop.close()


def test_partial_rollouts_take_the_paged_engine_in_process_or_on_servers():
    remote = RolloutConfig(engine="remote", options={"local_servers": 2}, partial_rollouts="recompute")
    assert remote.partial_rollouts == "recompute"
    with pytest.raises(ValueError, match=r"partial_rollouts = 'continue': needs an engine that takes weights "
                                         r"mid-rollout; rollout.engine='vllm' does not \(engines that do: paged, remote\)"):
        RolloutConfig(engine="vllm", options={"servers": ("http://127.0.0.1:1/v1",)}, partial_rollouts="continue")


def gate(engine, *, beside_from: int, at: int):
    """Place the switch in a run as tests/algos/test_algo_partial_rollouts.py does, on the server's
    engine: from its `beside_from`-th rollout on (the collections beside an update; the ones before
    evaluate or fill the queue in line, with nothing published), it takes no new weights before its
    call `at` and waits there for them (the update beside it publishes them), so calls 1..at sample
    with the pinned version and the calls after with the next, however long the update takes."""
    generate, call, follow = engine.generate, engine.call, engine.follow_feed
    rollouts, calls = [0], [0]

    def counted_generate(*args):
        rollouts[0], calls[0] = rollouts[0] + 1, 0
        return generate(*args)

    def counted_call(*args):
        calls[0] += 1
        return call(*args)

    def gated_follow():
        if rollouts[0] < beside_from or calls[0] < at:
            return False
        if calls[0] == at:
            deadline = time.monotonic() + 120
            while engine.feed.newer_than(engine.version) is None:
                assert time.monotonic() < deadline, "no weights published beside the collection"
                time.sleep(0.005)
        return follow()

    engine.generate, engine.call, engine.follow_feed = counted_generate, counted_call, gated_follow


@pytest.mark.e2e  # a GRPO run of 4 steps against a server on a thread
def test_an_async_grpo_run_on_a_server_samples_rows_with_two_versions(tmp_path):
    """training.max_staleness=2: batches 1-2 are sampled in line by W(0); batch n+2 is collected
    beside update n with W(n-1) pinned, and W(n) published into it: trained at step n+2 (current
    weights W(n+1)) its tokens lag 2 (calls 1-2) and 1 (after the switch), in the same rows."""
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1?", "answer": f"#### {a + 1}"}) + "\n" for a in range(8)))
    served = served_folder(HF, EngineOptions(
        max_prompt_tokens=256, max_new_tokens=16, top_logprobs=0, partial_rollouts="continue",
        engine=PagedSettings(slots=8, page_size=4, steps_per_sync=2, prefill_chunk=64)))
    gate(served.loop.engine, beside_from=3, at=7)  # rollouts 1-2 fill the queue; 12 calls a rollout here
    running = serve_in_thread(served)
    try:
        assert main([
            "train", "--model", str(HF), "--task", "gsm8k", "--data", str(data), "--algo", "grpo", "--no-progress",
            "--output", str(tmp_path / "run"), "training.num_steps=4", "training.prompts_per_step=2",
            "algorithm.group_size=2", "rollout.seed=3", "task.options.heldout_size=2",
            "task.options.max_new_tokens=16", "eval.every_steps=0", "eval.samples_per_prompt=1", "eval.pass_k=1",
            "training.async_rollout=one_step", "training.max_staleness=2", "rollout.engine=remote",
            f"rollout.options.servers=[{running.url}]", "rollout.partial_rollouts=continue", "rollout.temperature=1.0",
        ]) == 0  # fmt: skip
    finally:
        running.stop()
        served.loop.close()
    engine = served.loop.engine
    assert engine.switches == 4  # the collections beside updates 1-4 (batch 6 is collected, never trained)
    history = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    lag = {m["step"]: (m["rollout/staleness_token_lag_mean"], m["rollout/staleness_token_lag_max"])
           for m in history if "rollout/staleness_token_lag_max" in m}
    assert lag[1] == (0.0, 0.0) and lag[2] == (1.0, 1.0)  # W(0)'s batches, in line
    for step in (3, 4):  # tokens of two versions: lag 2 before the switch, 1 after
        mean, most = lag[step]
        assert most == 2.0 and 1.0 < mean < 2.0, (step, lag[step])


@pytest.mark.e2e  # a `trainer serve` process
def test_a_local_server_started_with_the_run_s_mode_takes_a_publish_into_its_generation(v1_v2, tmp_path):
    """`rollout.options.local_servers` start `trainer serve --partial-rollouts <mode>` (trainer.remote.local):
    such a process takes a publish into its generation, and reports the version it then holds
    once its next generation has switched."""
    from trainer.remote import local

    try:
        [url] = local.launch(HF, 1, **SHAPES, partial_rollouts="recompute")
        remote = RemoteBackend([url], max_new_tokens=T, pad_id=0, weights_url=str(tmp_path),
                               partial_rollouts="recompute")
        remote.update_weights(v1_v2[0], 1)
        assert remote.publish(v1_v2[1], 2) is True and remote.served_version(url) == 1  # offered, not yet taken
        got = remote.generate(requests(), SAMPLED, jax.random.key(3))  # takes it before its first device call
        assert (np.where(got.mask > 0, got.token_version, 2) == 2).all() and remote.served_version(url) == 2
    finally:
        local.stop()
