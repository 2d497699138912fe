"""Engine servers a run starts on its own host (`rollout.local_servers=N`): `trainer serve`
processes of the run's model, started before the learner and stopped when the run ends."""

from __future__ import annotations

import atexit
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

_STARTED: list[subprocess.Popen] = []
LAUNCHED: list[subprocess.Popen] = []
"""Every server process started, in order (what a test kills)."""


def start(rollout: Any) -> list[str]:
    """URLs of the servers trainer.remote.local.launch started for this process (none unless
    rollout.local_servers asked for some and the run launched them)."""
    if rollout.local_servers and len(_URLS) < rollout.local_servers:
        raise ValueError(f"rollout.local_servers={rollout.local_servers}: the run starts them from the model's "
                         f"folder (trainer run); building the engine alone, give rollout.servers=[urls]")
    return list(_URLS[: rollout.local_servers])


_URLS: list[str] = []


def launch_for(settings: Any, log: Any = print) -> list[str]:
    """The run's `rollout.local_servers` servers of its model folder, with its rollout's shapes."""
    from rl_core.rollout.factory import engine_settings

    rollout = settings.rollout
    if not settings.model.path:
        raise ValueError("rollout.local_servers needs model.path (a model folder the servers load)")
    shapes = engine_settings(rollout)
    urls = launch(settings.model.path, rollout.local_servers, max_prompt_tokens=shapes.max_prompt_tokens,
                  max_new_tokens=shapes.max_new_tokens, slots=shapes.slots, page_size=shapes.page_size,
                  steps_per_sync=shapes.steps_per_sync, prefill_chunk=shapes.prefill_chunk)
    log(f"rollout.local_servers: {len(urls)} engine servers at {', '.join(urls)}")
    return urls


def launch(model: str | Path, n: int, *, max_prompt_tokens: int, max_new_tokens: int, slots: int,
           page_size: int, steps_per_sync: int, prefill_chunk: int, ports: list[int] | None = None,
           wait_s: float = 300.0) -> list[str]:
    """Start `n` `trainer serve` processes of the model folder `model` on `ports` (default free ones);
    their base URLs once each answers /health (a process that exits first is one clear line)."""
    procs = []
    for i in range(n):
        port = 0 if ports is None else ports[i]
        cmd = [sys.executable, "-c", "import sys; from trainer.cli import main; sys.exit(main(sys.argv[1:]))",
               "serve", "--model", str(model), "--port", str(port),
               "--max-prompt-tokens", str(max_prompt_tokens), "--max-new-tokens", str(max_new_tokens),
               "--slots", str(slots), "--page-size", str(page_size), "--steps-per-sync", str(steps_per_sync),
               "--prefill-chunk", str(prefill_chunk), "--print-url"]
        err = tempfile.NamedTemporaryFile("w+", prefix="engine-server-", suffix=".log", delete=False)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True))
        procs[-1].log = err.name  # type: ignore[attr-defined]
        err.close()  # the child writes to its own copy
    _STARTED.extend(procs)
    LAUNCHED.extend(procs)
    urls = []
    for proc in procs:
        line = proc.stdout.readline().strip() if proc.stdout else ""
        if not line.startswith("http"):
            last = Path(proc.log).read_text().strip().splitlines()[-1:]  # type: ignore[attr-defined]
            raise RuntimeError(f"a local engine server did not start: {last[0] if last else line}")
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
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    _STARTED.clear()
    _URLS.clear()


atexit.register(stop)
