"""The `remote` rollout engine: a step's requests sent to engine servers (`trainer serve`).

`rollout.engine=remote` with `rollout.options.servers=[urls]` (and/or `rollout.options.local_servers=N`,
which the run starts: trainer.remote.local); its settings are `trainer.remote.settings.RemoteSettings`. Per step:

- weights: `update_weights` writes the whole tree once as a safetensors snapshot
  (`rollout.options.weights_url`, trainer.remote.weights) and every server loads it as that version
  between its rollouts (`rollout.options.weights_url=stream`: the snapshot's bytes are sent to each
  server instead); a server that cannot is left out until a later version reaches it;
- requests: each prompt (with all its samples) goes to the server with the least work assigned
  so far (new tokens to decode), with its prompt id, so its completions use the keys the
  in-process paged engine would give it: the same numbers, whichever server decodes it;
- sessions (an episode's turns): `new_sessions` hands out keys; a prompt whose rows name keys goes
  to the server that decoded their last turn (it holds their sequences: the turn's prefill starts
  where the held tokens and the new prompt part); its first turn goes where the load is least. A
  prompt whose server is left out goes to another, which prefills its whole history (the same
  tokens and log-probs: a retained sequence only saves work). `release` reaches the servers that
  hold the keys;
- faults: a server that fails a request is left out and its prompts go to the others in the same
  step; when none is left the step stops with one line naming them. A left-out server is asked
  for its version before each step and rejoins (given the current weights) once it answers.

Every row and token carries the version the server sampled it with.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

import httpx
import jax
import numpy as np
from rl_core.rollout import Capabilities, Engine, EngineBuild, EngineCounters, memory_elsewhere, Requests
from rl_core import Completions, SamplingParams

from trainer.remote import weights as weights_lib
from trainer.remote.settings import RemoteSettings


class NoServerLeft(RuntimeError):
    """Every engine server failed."""


class RemoteBackend:
    """`RolloutBackend` over engine servers; see the module docstring."""

    capabilities = Capabilities(row_limits=True, retains=True)
    """Each row stops at its own limit; sessions are kept on the server that holds them (`trainer
    serve`'s paged engine retains sequences; one that did not would prefill each turn whole, with
    the same numbers). With `partial_rollouts` on, also `takes_published`: `publish` reaches the
    generations running on the servers (started with `--partial-rollouts`, as `rollout.options.local_servers`
    are), as the in-process paged engine's does with its own mode on."""
    engine_name = "remote"
    """Its `rollout.engine` name, for its errors."""

    def __init__(self, servers: Sequence[str], *, max_new_tokens: int, pad_id: int, weights_url: str | None = None,
                 timeout_s: float = 600.0, max_lag: int = 0, partial_rollouts: str = "off") -> None:
        if not servers:
            raise ValueError("rollout.engine=remote needs rollout.options.servers=[urls] or "
                             "rollout.options.local_servers=N")
        self.servers = [s.rstrip("/") for s in servers]
        if partial_rollouts != "off":  # the servers' engines switch mid-rollout (`publish`)
            self.capabilities = dataclasses.replace(self.capabilities, takes_published=True)
        self.max_new_tokens, self.pad_id = max_new_tokens, pad_id
        self.stream = weights_url == "stream"  # the snapshot sent to each server, not written to storage
        self.weights_url = (weights_url or tempfile.mkdtemp(prefix="rl-weights-")).rstrip("/")
        self.client = httpx.Client(timeout=timeout_s)
        weakref.finalize(self, self.client.close)  # its connections close with it, however it goes
        self.version = -1
        self.down: dict[str, str] = {}  # server -> why it is left out
        self.served: dict[str, int] = {s: -1 for s in self.servers}  # the version each one holds
        self.publish_seconds: list[float] = []  # writing each version's snapshot
        self.load_seconds: list[float] = []  # until every server took it
        self.snapshot_bytes = 0
        self.sent: dict[str, int] = {s: 0 for s in self.servers}  # prompts each server decoded
        self.client_id = uuid.uuid4().hex  # names this trainer's session keys on the servers
        self.home: dict[int, str] = {}  # session key -> the server that holds its sequence
        self._next_session = 0
        self.max_lag = max_lag
        self._lock = threading.Lock()  # the published version and who is loading it
        # (publish count, version, its snapshot: a URL, or bytes when streamed); each server loads
        # every publish it has not taken (the newest only, when it fell behind): the same version again
        # too, which another trainer may have replaced on it
        self._published: tuple[int, int, Any] = (0, -1, None)
        self._took: dict[str, int] = {s: 0 for s in self.servers}  # the last publish each server loaded
        self._loading: dict[str, concurrent.futures.Future] = {}  # server -> its background load
        self._loader = concurrent.futures.ThreadPoolExecutor(len(self.servers), thread_name_prefix="remote-weights")
        weakref.finalize(self, self._loader.shutdown, wait=False)

    # -- weights ---------------------------------------------------------------------------------

    def update_weights(self, params: Any, version: int) -> None:
        start = time.perf_counter()
        snapshot = self.write_snapshot(params, version)
        self.publish_seconds.append(time.perf_counter() - start)
        start = time.perf_counter()
        with self._lock:
            self._published = (self._published[0] + 1, version, snapshot)
            self.version = version
        loading = [self._catch_up(s) for s in self.servers if s not in self.down]
        if not self.max_lag:  # every server takes it before the next rollout
            concurrent.futures.wait(loading)
            self.load_seconds.append(time.perf_counter() - start)

    def loaded(self) -> None:
        """Wait until every server up took the published weights (or failed to)."""
        concurrent.futures.wait(list(self._loading.values()))

    def _catch_up(self, server: str) -> concurrent.futures.Future:
        """Have `server` load the published version in the background, one load at a time, the newest
        each time (a load that ends behind a newer publish is followed by that one)."""
        with self._lock:
            if server not in self._loading:
                self._loading[server] = self._loader.submit(self._load_until_current, server)
            return self._loading[server]

    def _load_until_current(self, server: str) -> None:
        while True:
            with self._lock:
                if server in self.down or self._took[server] == self._published[0]:
                    del self._loading[server]
                    return
                publish, version, snapshot = self._published
            try:
                self.served[server], self._took[server] = self.load_snapshot(server, snapshot, version), publish
            except (httpx.HTTPError, KeyError, ValueError) as e:
                self.down[server] = _why(e)

    # what differs between kinds of servers (trainer.remote.vllm_engine overrides these three)

    def write_snapshot(self, params: Any, version: int) -> Any:
        """Publish `params` as `version` once: the snapshot's URL, or its bytes when streamed."""
        if self.stream:  # the bytes go to each server over its connection
            snapshot: Any = weights_lib.snapshot(params)
            self.snapshot_bytes = len(snapshot)
            return snapshot
        snapshot = f"{self.weights_url}/v{version}.safetensors"
        self.snapshot_bytes = weights_lib.write(params, snapshot)
        return snapshot

    def load_snapshot(self, server: str, snapshot: Any, version: int) -> int:
        """Have `server` load a published snapshot; the version it then serves."""
        if self.stream:
            r = self.client.post(f"{server}/engine/weights", params={"version": version},
                                 content=snapshot, headers={"content-type": "application/octet-stream"})
        else:
            r = self.client.post(f"{server}/engine/weights", json={"url": snapshot, "version": version})
        r.raise_for_status()
        return int(r.json()["version"])

    def served_version(self, server: str) -> int:
        """The weight version `server` reports (-1 before any)."""
        r = self.client.get(f"{server}/engine/version", timeout=5.0)
        r.raise_for_status()
        return int(r.json()["version"])

    def _rejoin(self) -> None:
        """Ask each left-out server for its version; one that answers rejoins at it and is given the
        current weights (waited for unless servers may lag)."""
        loading = []
        for server in list(self.down):
            try:
                self.served[server] = self.served_version(server)
            except (httpx.HTTPError, KeyError, ValueError):
                continue
            del self.down[server]
            self._took[server] = 0  # whatever it held, it gets the current weights again
            if self.version >= 0:
                loading.append(self._catch_up(server))
        if not self.max_lag:
            concurrent.futures.wait(loading)

    # -- generation ------------------------------------------------------------------------------

    def generate(self, requests: Requests, sampling: SamplingParams, key: jax.Array) -> Completions:
        if self.version < 0:
            raise RuntimeError(f"{type(self).__name__}.generate before update_weights: no weights to decode with")
        self._rejoin()
        mask = np.asarray(requests.prompt_mask) > 0
        prompts = [np.asarray(requests.prompt_tokens)[i][mask[i]].tolist() for i in range(len(mask))]
        ids, limits, stops = requests.ids(), requests.limits(self.max_new_tokens), requests.stops()
        g = requests.num_samples
        body = {"num_samples": g, "sampling": {"temperature": sampling.temperature, "top_k": sampling.top_k,
                                               "top_p": sampling.top_p},
                "key": np.asarray(jax.random.key_data(key)).tolist()}
        keys = requests.handles().reshape(len(prompts), g)  # [U, G] each row's session key (-1: none)
        rows: dict[int, dict[str, Any]] = {}  # prompt index -> its G rows
        todo = list(range(len(prompts)))
        while todo:
            shares = self._deal(todo, limits, g, keys)
            todo = []
            with concurrent.futures.ThreadPoolExecutor(max(len(shares), 1)) as pool:
                futures = {pool.submit(self._send, server, share, prompts, ids, limits, stops, keys, body):
                           (server, share) for server, share in shares.items()}
                for future, (server, share) in futures.items():
                    try:
                        rows.update(future.result())
                    except (httpx.HTTPError, KeyError, ValueError) as e:
                        self.down[server] = _why(e)
                        todo += share  # to the others, in this same step
        return self._completions([rows[i] for i in range(len(prompts))], g)

    def _live(self) -> list[str]:
        """The servers up and at most `max_lag` versions behind; while none is, waits for a load."""
        while True:
            live = [s for s in self.servers if s not in self.down and self.served[s] >= 0
                    and 0 <= self.version - self.served[s] <= self.max_lag]
            pending = [f for f in self._loading.values() if not f.done()]
            if live or not pending:
                break
            concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
        if not live:
            why = "; ".join(f"{s}: {w}" for s, w in self.down.items()) or (
                f"none holds version {self.version} or one at most {self.max_lag} behind it")
            raise NoServerLeft(f"rollout.engine={self.engine_name}: no engine server left ({why})")
        return live

    def _deal(self, todo: list[int], limits: np.ndarray, g: int, keys: np.ndarray) -> dict[str, list[int]]:
        """Each prompt to the live server that holds its sessions, else to the one with the least new
        tokens assigned so far (longest first)."""
        load = {s: 0 for s in self._live()}
        homes = {i: next((self.home[k] for k in keys[i].tolist() if self.home.get(k) in load), None) for i in todo}
        shares: dict[str, list[int]] = {}
        for i in sorted(todo, key=lambda i: (homes[i] is None, -int(limits[i]))):  # kept turns first
            server = homes[i] or min(load, key=lambda s: (load[s], self.servers.index(s)))
            load[server] += int(limits[i]) * g
            shares.setdefault(server, []).append(i)
        return shares

    def _send(self, server: str, share: list[int], prompts: list[list[int]], ids: np.ndarray, limits: np.ndarray,
              stops: list[tuple[str, ...]], keys: np.ndarray, body: dict[str, Any]) -> dict[int, dict[str, Any]]:
        share = sorted(share)
        payload = body | {"prompts": [prompts[i] for i in share], "prompt_ids": [int(ids[i]) for i in share],
                          "max_new_tokens": [int(limits[i]) for i in share]}
        if any(stops[i] for i in share):
            payload["stop_strings"] = [list(stops[i]) for i in share]
        mine = keys[share].reshape(-1)
        if (mine >= 0).any():
            payload |= {"client": self.client_id, "sessions": mine.tolist()}
        r = self.client.post(f"{server}/engine/generate", json=payload)
        r.raise_for_status()
        out = r.json()
        self.sent[server] += len(share)
        self.home.update((k, server) for k in mine.tolist() if k >= 0)  # it holds their sequences now
        g = body["num_samples"]
        return {i: {k: out[k][j * g:(j + 1) * g] for k in ("tokens", "logp", "token_version", "truncated")}
                for j, i in enumerate(share)}

    def _completions(self, per_prompt: list[dict[str, Any]], g: int) -> Completions:
        b, t = len(per_prompt) * g, self.max_new_tokens
        tokens = np.full((b, t), self.pad_id, np.int32)
        logp = np.zeros((b, t), np.float32)
        versions = np.full((b, t), self.version, np.int32)
        lengths = np.zeros(b, np.int32)
        truncated = np.zeros(b, bool)
        for i, got in enumerate(per_prompt):
            for j in range(g):
                row, n = i * g + j, len(got["tokens"][j])
                tokens[row, :n], logp[row, :n], lengths[row] = got["tokens"][j], got["logp"][j], n
                truncated[row] = got["truncated"][j]
                if n:
                    versions[row, :n], versions[row, n:] = got["token_version"][j], got["token_version"][j][-1]
        mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
        return Completions(tokens, logp, mask, lengths, truncated, versions.min(axis=1), versions)

    # -- sessions and the rest of the contract ---------------------------------------------------

    def new_sessions(self, n: int) -> np.ndarray:
        if not self.capabilities.retains:  # servers that keep no sequence (a subclass's: vLLM's)
            return np.full(n, -1, np.int64)
        handles = np.arange(self._next_session, self._next_session + n, dtype=np.int64)
        self._next_session += n
        return handles

    def release(self, handles: Sequence[int] | np.ndarray | None = None) -> None:
        """Free the sequences held under `handles` (None: all) on the servers that hold them; a server
        that does not answer lost them anyway."""
        if handles is None:
            by_server: dict[str, list[int] | None] = {s: None for s in self.servers if s not in self.down}
            self.home.clear()
        else:
            by_server = {}
            for k in np.asarray(handles, np.int64).reshape(-1).tolist():
                if k in self.home:
                    by_server.setdefault(self.home.pop(k), []).append(k)
        for server, keys in by_server.items():
            try:
                self.client.post(f"{server}/engine/release", json={"client": self.client_id, "sessions": keys},
                                 timeout=30.0).raise_for_status()
            except httpx.HTTPError:
                pass

    def publish(self, params: Any, version: int) -> bool:
        """Write `params` as `version` once and offer it to the generation each server up is running
        (`/v1/engine/weights` with into_running): each switches at its next device call, as the
        in-process paged engine does. True when a server took it; one that did not (down, or
        started without --partial-rollouts) finishes its rollout with the weights it has. False
        (nothing written) without partial rollouts."""
        if not self.capabilities.takes_published:
            return False
        snapshot = self.write_snapshot(params, version)
        up = [s for s in self.servers if s not in self.down]
        with concurrent.futures.ThreadPoolExecutor(max(len(up), 1), thread_name_prefix="remote-publish") as pool:
            took = list(pool.map(lambda s: self._offer(s, snapshot, version), up))
        return any(took)

    def _offer(self, server: str, snapshot: Any, version: int) -> bool:
        try:
            if self.stream:
                r = self.client.post(f"{server}/engine/weights", params={"version": version, "into_running": 1},
                                     content=snapshot, headers={"content-type": "application/octet-stream"})
            else:
                r = self.client.post(f"{server}/engine/weights",
                                     json={"url": snapshot, "version": version, "into_running": True})
            r.raise_for_status()
        except httpx.HTTPError:
            return False  # its rollout keeps the weights it has; the next update reaches it as usual
        return True

    def counters(self) -> EngineCounters:
        return EngineCounters()  # counted on the servers


    def close(self) -> None:
        self._loader.shutdown(wait=True)
        self.client.close()


def _why(e: Exception) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())[:200]


def _build(b: EngineBuild) -> RemoteBackend:
    from trainer.remote import local

    settings: RemoteSettings = b.settings if b.settings is not None else b.rollout.engine_settings()
    servers = list(settings.servers) + local.start(settings)
    return RemoteBackend(servers, max_new_tokens=b.rollout.max_new_tokens, pad_id=b.pad_id,
                         weights_url=settings.weights_url, max_lag=settings.max_lag,
                         partial_rollouts=b.rollout.partial_rollouts)


ENGINE = Engine(name="remote", build=_build, memory=memory_elsewhere, settings=RemoteSettings,
                offers=Capabilities(row_limits=True, retains=True, takes_published=True))
"""Its servers hold the cache and the weights; on the trainer's devices it holds nothing (`trainer plan`).
It takes weights mid-rollout (partial rollouts) on servers started with --partial-rollouts; it records
no routing, and agents are not served over it."""
