"""The `remote` engine (trainer.remote.engine) against the in-process paged engine, on two engine
servers (the `trainer serve` app on threads of this process; tests/e2e kills real processes).

Same weights, same key: every completion has the tokens and log-probs the in-process engine
gives it, whichever server decoded it, and carries the version the servers were given.
"""

import concurrent.futures
import threading
import time
from pathlib import Path

import httpx
import jax
import numpy as np
import pytest
from flax import nnx
from rl_core.policy.tokens import left_pad
from rl_core.rollout.backend import Requests, RolloutBackend
from rl_core.rollout.paged import EngineSettings, PagedBackend
from rl_core.rollout.paged_settings import PagedSettings
from rl_core.rollout.sampler import SamplingParams
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model

from trainer.remote.engine import NoServerLeft, RemoteBackend
from trainer.serve import EngineOptions, serve_in_thread, served_folder
from tolerances import close
from host import need_sockets

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen2"
T = 6
OPTIONS = EngineOptions(max_prompt_tokens=16, max_new_tokens=T, top_logprobs=0,
                        engine=PagedSettings(slots=4, page_size=4, steps_per_sync=2, prefill_chunk=8))
PROMPTS = ([5, 17, 40], [9, 200, 31, 7, 3, 88], [11, 12], [250, 3, 4, 5])
SAMPLED = SamplingParams(temperature=1.0)


@pytest.fixture(scope="module")
def servers():
    need_sockets()
    served = [served_folder(HF, OPTIONS) for _ in range(2)]
    running = [serve_in_thread(s) for s in served]
    yield running
    for r, s in zip(running, served, strict=True):
        r.stop()
        s.loop.close()


def trained():
    """Weights other than the folder's (what a learner publishes after an update)."""
    model = load_hf_model(HF)
    state = nnx.state(model, nnx.Param)
    nnx.update(model, jax.tree.map(lambda x: x * 1.1, state))
    return model


def requests():
    tokens, mask = left_pad([list(p) for p in PROMPTS], pad_id=0, max_tokens=8)
    return Requests(tokens, mask, num_samples=2, prompt_ids=np.array([40, 41, 42, 43]))


def in_process(model):
    graphdef, state = nnx.split(model)
    settings = EngineSettings(max_prompt_tokens=16, max_new_tokens=T, page_size=4, slots=4, prefill_chunk=8,
                              steps_per_sync=2)
    engine = PagedBackend(graphdef, settings, paging=PAGED_TRANSFORMER, eos_ids=(302,), pad_id=0)
    engine.update_weights(state, 1)
    return engine.generate(requests(), SAMPLED, jax.random.key(3))


def test_two_servers_give_the_in_process_numbers(servers, tmp_path):
    model = trained()
    remote = RemoteBackend([r.url for r in servers], max_new_tokens=T, pad_id=0, weights_url=str(tmp_path))
    assert isinstance(remote, RolloutBackend)
    remote.update_weights(nnx.split(model)[1], 1)
    assert (tmp_path / "v1.safetensors").exists() and remote.served == {r.url: 1 for r in servers}
    got = remote.generate(requests(), SAMPLED, jax.random.key(3))
    want = in_process(model)
    np.testing.assert_array_equal(got.lengths, want.lengths)
    np.testing.assert_array_equal(got.tokens * got.mask, np.asarray(want.tokens) * np.asarray(want.mask))
    np.testing.assert_allclose(got.logp, np.asarray(want.logp) * np.asarray(want.mask), **close(atol=1e-5))
    assert (got.version == 1).all() and (got.token_version == 1).all()
    assert sorted(remote.sent.values()) == [2, 2]  # least-loaded: two prompts each

    # the same weights streamed to the servers as version 2 (no shared storage): the same numbers
    streamed = RemoteBackend([r.url for r in servers], max_new_tokens=T, pad_id=0, weights_url="stream")
    streamed.update_weights(nnx.split(model)[1], 2)
    assert streamed.served == {r.url: 2 for r in servers} and streamed.snapshot_bytes == remote.snapshot_bytes
    out = streamed.generate(requests(), SAMPLED, jax.random.key(3))
    np.testing.assert_array_equal(out.tokens, got.tokens)
    assert (out.token_version == 2).all()
    remote.update_weights(nnx.split(model)[1], 1)  # the file again: servers switch back to it

    # one server gone before the step: its prompts go to the other, the numbers stay
    servers[1].stop()
    again = remote.generate(requests(), SAMPLED, jax.random.key(3))
    np.testing.assert_array_equal(again.tokens, got.tokens)
    assert list(remote.down) == [servers[1].url]
    servers[0].stop()
    with pytest.raises(NoServerLeft, match=r"^rollout.engine=remote: no engine server left \(http"):
        remote.generate(requests(), SAMPLED, jax.random.key(3))


@pytest.fixture(scope="module")
def session_servers():
    served = [served_folder(HF, OPTIONS) for _ in range(2)]
    running = [serve_in_thread(s) for s in served]
    yield running, served
    for r, s in zip(running, served, strict=True):
        r.stop()
        s.loop.close()


def turn(histories, ids, sessions):
    tokens, mask = left_pad(histories, pad_id=0, max_tokens=16)
    return Requests(tokens, mask, prompt_ids=np.asarray(ids), max_new_tokens=np.full(len(histories), 3),
                    sessions=sessions)


@pytest.mark.e2e  # about 5 s: three turns on two servers and in process
def test_an_episodes_turns_stay_on_the_server_that_holds_its_sequence(session_servers, tmp_path):
    """Three turns of four episodes (each turn: the history so far, the last completion and one
    observation token): turn 2 goes to the servers that decoded turn 1 and continues the sequences
    they hold; with one server stopped, its episodes' turn 3 is prefilled whole on the other. The
    tokens and log-probs are the in-process engine's with its own retained sequences throughout."""
    running, served = session_servers
    model = trained()
    graphdef, state = nnx.split(model)
    local = PagedBackend(graphdef, EngineSettings(max_prompt_tokens=16, max_new_tokens=T, page_size=4, slots=4,
                                                  prefill_chunk=8, steps_per_sync=2),
                         paging=PAGED_TRANSFORMER, eos_ids=(302,), pad_id=0)
    local.update_weights(state, 1)
    remote = RemoteBackend([r.url for r in running], max_new_tokens=T, pad_id=0, weights_url=str(tmp_path))
    remote.update_weights(state, 1)
    assert remote.capabilities.retains
    keys, here = remote.new_sessions(4), local.new_sessions(4)
    assert keys.tolist() == [0, 1, 2, 3] and remote.new_sessions(2).tolist() == [4, 5]  # never given twice
    histories = [[5, 17, 40], [9, 200, 31], [11, 12], [250, 3]]
    homes, reused, local_reused = [], [], []
    for step in range(3):
        if step == 2:
            running[1].stop()  # the second server's episodes go to the first
        ids = [100 * step + i for i in range(4)]
        before = [s.loop.engine.counters().reused_tokens for s in served] + [local.counters().reused_tokens]
        got = remote.generate(turn(histories, ids, keys), SAMPLED, jax.random.key(step))
        want = local.generate(turn(histories, ids, here), SAMPLED, jax.random.key(step))
        np.testing.assert_array_equal(got.tokens * got.mask, np.asarray(want.tokens) * np.asarray(want.mask))
        np.testing.assert_allclose(got.logp, np.asarray(want.logp) * np.asarray(want.mask), **close(atol=1e-5))
        homes.append([remote.home[k] for k in keys.tolist()])
        reused.append([s.loop.engine.counters().reused_tokens - b for s, b in zip(served, before, strict=False)])
        local_reused.append(local.counters().reused_tokens - before[-1])
        histories = [h + got.tokens[i, :got.lengths[i]].tolist() + [7] for i, h in enumerate(histories)]
    urls = [r.url for r in running]
    assert sorted(homes[0]) == sorted(urls * 2)  # least-loaded: two episodes each
    assert reused[0] == [0, 0] and local_reused[0] == 0  # nothing held yet
    # turn 2 where turn 1 was: each server continues its own two episodes, as the one engine continues all four
    assert homes[1] == homes[0] and min(reused[1]) > 0 and sum(reused[1]) == local_reused[1]
    # turn 3: all on the first server; the two episodes that moved there are prefilled whole
    assert homes[2] == [urls[0]] * 4 and reused[2][1] == 0 and 0 < reused[2][0] < local_reused[2]
    assert len(served[0].loop.engine.retained.held) == 4
    remote.release(keys)
    assert remote.home == {} and len(served[0].loop.engine.retained.held) == 0


@pytest.fixture
def lag_servers():
    served = [served_folder(HF, OPTIONS) for _ in range(2)]
    running = [serve_in_thread(s) for s in served]
    yield running, served
    for hold in HOLDS:  # a failed test leaves no engine thread held
        hold.set()
    for r, s in zip(running, served, strict=True):
        r.stop()
        s.loop.close()


HOLDS: list[threading.Event] = []


def until(done, polls: int = 6000) -> None:
    """Wait for `done()` (the first server's background load), polling every 10 ms, a minute at most."""
    for _ in range(polls):
        if done():
            return
        time.sleep(0.01)
    raise AssertionError("the first server never took the new version")


def busy(served) -> threading.Event:
    """Hold a server's engine thread (as a long rollout or a slow load would) until the event is set."""
    hold = threading.Event()
    HOLDS.append(hold)
    threading.Thread(target=served.loop.call, args=(hold.wait,), daemon=True).start()
    return hold


@pytest.mark.e2e  # about 5 s: five versions on two servers
def test_a_server_lagging_within_the_allowance_is_used_and_one_further_behind_is_not(lag_servers, tmp_path):
    """rollout.options.max_lag=1: each completion carries the version that sampled it; a server two
    versions behind gets no requests until it has caught up; one version behind still does."""
    (a, b), (served_a, served_b) = lag_servers
    state = nnx.split(trained())[1]
    remote = RemoteBackend([a.url, b.url], max_new_tokens=T, pad_id=0, weights_url=str(tmp_path), max_lag=1)
    for version in (1, 2):
        remote.update_weights(state, version)
    remote.loaded()
    assert remote.served == {a.url: 2, b.url: 2}
    # the second server holds version 1 again (what a server whose load of 2 has not ended serves)
    httpx.post(f"{b.url}/engine/weights", json={"url": f"{tmp_path}/v1.safetensors", "version": 1}).raise_for_status()
    out = remote.generate(requests(), SAMPLED, jax.random.key(3))
    versions = sorted(set(np.asarray(out.version).tolist()))
    assert versions == [1, 2] and (np.asarray(out.token_version).min(axis=1) == out.version).all()

    # versions 3 and 4 while the second server is busy: two behind, it gets nothing
    hold = busy(served_b)
    remote.update_weights(state, 3)
    remote.update_weights(state, 4)
    until(lambda: remote.served[a.url] == 4)
    sent_b = remote.sent[b.url]
    out = remote.generate(requests(), SAMPLED, jax.random.key(3))
    assert remote.sent[b.url] == sent_b and (out.version == 4).all() and remote.served[b.url] == 2
    hold.set()  # it takes 4 (the newest; 3 was never sent): used again
    remote.loaded()
    assert remote.served == {a.url: 4, b.url: 4}

    # version 5 while it is busy again: one behind, it still gets its share (decoded once it is free,
    # with the weights it holds then)
    hold = busy(served_b)
    remote.update_weights(state, 5)
    until(lambda: remote.served[a.url] == 5)
    assert remote.served[b.url] == 4
    done = concurrent.futures.ThreadPoolExecutor(1).submit(remote.generate, requests(), SAMPLED, jax.random.key(3))
    hold.set()
    out = done.result()
    assert remote.sent[b.url] == sent_b + 2 and (out.version == 5).all()
    remote.close()
