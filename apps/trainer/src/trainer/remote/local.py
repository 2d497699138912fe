"""Engine servers a run starts on its own host (`rollout.options.local_servers=N` with rollout.engine=remote):
`trainer serve` processes of the run's model folder with its rollout's shapes and the paged engine's
settings in its options, started before the learner and stopped when the process exits (a run resumed
in the same process keeps them)."""

from __future__ import annotations

import atexit
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

FLEET: list[tuple[subprocess.Popen, str]] = []
"""Every server process started here, with its base URL, in order (what a test kills)."""


def _alive() -> list[str]:
    return [url for proc, url in FLEET if proc.poll() is None]


def start(remote: Any) -> list[str]:
    """URLs of the servers `launch_for` started for this run (none without `local_servers` in the
    remote engine's settings, `remote`)."""
    if not remote.local_servers:
        return []
    alive = _alive()
    if len(alive) < remote.local_servers:
        raise ValueError(f"rollout.options.local_servers={remote.local_servers}: `trainer train` starts them from "
                         f"model.path; building the engine alone, give rollout.options.servers=[urls]")
    return alive[-remote.local_servers:]


def launch_for(settings: Any, log: Any = print) -> list[str]:
    """The run's `rollout.options.local_servers` servers of its model folder, with its rollout's shapes."""
    from rl_core.rollout import EngineSettings

    rollout = settings.rollout
    wanted = rollout.engine_settings().local_servers
    alive = _alive()
    if len(alive) >= wanted:  # a run resumed in this process keeps its fleet
        return alive[-wanted:]
    if not settings.model.path:
        raise ValueError("rollout.options.local_servers needs model.path (a model folder the servers load)")
    shapes = EngineSettings.from_rollout(rollout)
    urls = launch(settings.model.path, wanted - len(alive), max_prompt_tokens=shapes.max_prompt_tokens,
                  max_new_tokens=shapes.max_new_tokens, slots=shapes.slots, page_size=shapes.page_size,
                  steps_per_sync=shapes.steps_per_sync, prefill_chunk=shapes.prefill_chunk,
                  partial_rollouts=rollout.partial_rollouts)
    log(f"rollout.options.local_servers: engine servers at {', '.join(alive + urls)}")
    return alive + urls


def launch(model: str | Path, n: int, *, max_prompt_tokens: int, max_new_tokens: int, slots: int,
           page_size: int, steps_per_sync: int, prefill_chunk: int, ports: list[int] | None = None,
           wait_s: float = 300.0, partial_rollouts: str = "off") -> list[str]:
    """Start `n` `trainer serve` processes of the model folder `model` on `ports` (default free ones);
    their base URLs once each answers /health (one that fails to start is one clear line)."""
    started = []
    for i in range(n):
        port = 0 if ports is None else ports[i]
        cmd = [sys.executable, "-c", "import sys; from trainer.cli import main; sys.exit(main(sys.argv[1:]))",
               "serve", "--model", str(model), "--port", str(port),
               "--max-prompt-tokens", str(max_prompt_tokens), "--max-new-tokens", str(max_new_tokens),
               "--slots", str(slots), "--page-size", str(page_size), "--steps-per-sync", str(steps_per_sync),
               "--prefill-chunk", str(prefill_chunk), "--top-logprobs", "0",
               "--partial-rollouts", partial_rollouts, "--print-url"]
        err = tempfile.NamedTemporaryFile("w+", prefix="engine-server-", suffix=".log", delete=False)
        started.append((subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True), err.name))
        err.close()  # the child writes to its own copy
    urls = []
    for proc, log in started:
        line = proc.stdout.readline().strip() if proc.stdout else ""
        if not line.startswith("http"):
            last = Path(log).read_text().strip().splitlines()[-1:]
            for other, _ in started:
                other.kill()
            raise RuntimeError(f"a local engine server did not start: {last[0] if last else 'no output'}")
        FLEET.append((proc, line))
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
    return urls


def stop() -> None:
    """Stop every server this process started."""
    for proc, _ in FLEET:
        if proc.poll() is None:
            proc.terminate()
    for proc, _ in FLEET:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
    FLEET.clear()


atexit.register(stop)
