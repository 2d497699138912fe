"""Engine servers a run starts on its own host (`rollout.local_servers=N`): `trainer serve`
processes of the run's model, started before the learner and stopped when the run ends."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

_STARTED: list[subprocess.Popen] = []


def start(rollout: Any) -> list[str]:
    """URLs of the servers trainer.remote.local.launch started for this process (none unless
    rollout.local_servers asked for some and the run launched them)."""
    if rollout.local_servers and len(_URLS) < rollout.local_servers:
        raise ValueError(f"rollout.local_servers={rollout.local_servers}: the run starts them from the model's "
                         f"folder (trainer run); building the engine alone, give rollout.servers=[urls]")
    return list(_URLS[: rollout.local_servers])


_URLS: list[str] = []


def launch(model: str | Path, n: int, *, max_prompt_tokens: int, max_new_tokens: int, slots: int,
           page_size: int, steps_per_sync: int, prefill_chunk: int, wait_s: float = 300.0) -> list[str]:
    """Start `n` `trainer serve` processes of the model folder `model` on free ports; their base URLs
    once each answers /health (a process that exits first is one clear line)."""
    procs = []
    for _ in range(n):
        cmd = [sys.executable, "-m", "trainer", "serve", "--model", str(model), "--port", "0",
               "--max-prompt-tokens", str(max_prompt_tokens), "--max-new-tokens", str(max_new_tokens),
               "--slots", str(slots), "--page-size", str(page_size), "--steps-per-sync", str(steps_per_sync),
               "--prefill-chunk", str(prefill_chunk), "--print-url"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=os.environ | {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}))
    _STARTED.extend(procs)
    urls = []
    for proc in procs:
        line = proc.stdout.readline().strip() if proc.stdout else ""
        if not line.startswith("http"):
            err = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"a local engine server did not start: {err.strip().splitlines()[-1:] or line}")
        urls.append(line)
    deadline = time.monotonic() + wait_s
    for url in urls:
        while True:
            try:
                httpx.get(url.removesuffix("/v1") + "/health", timeout=2.0).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the local engine server {url} did not answer /health in {wait_s:.0f} s")
                time.sleep(0.2)
    _URLS.extend(urls)
    return urls


def stop() -> None:
    """Stop every server this process started."""
    for proc in _STARTED:
        if proc.poll() is None:
            proc.terminate()
    for proc in _STARTED:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
    _STARTED.clear()
    _URLS.clear()


atexit.register(stop)
