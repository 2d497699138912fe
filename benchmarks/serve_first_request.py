"""How long `trainer serve`'s first requests take (they compile the engine's programs), with a cold
compilation cache and again after a restart (warm): a server on a free port, three identical chat
requests, one streamed, one at another temperature, then SIGTERM (its exit status and last line).

    uv run python benchmarks/serve_first_request.py MODEL_DIR [--cache DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import openai

ASK = [{"role": "user", "content": "What is 2+3?"}]


def one_start(folder: str, env: dict[str, str]) -> str:
    trainer = Path(sys.executable).parent / "trainer"
    start = time.perf_counter()
    server = subprocess.Popen([str(trainer), "serve", "--model", folder, "--port", "0"], stderr=subprocess.PIPE,
                              text=True, env=env)
    line = server.stderr.readline()
    listening = time.perf_counter() - start
    rest: list[str] = []
    reader = threading.Thread(target=lambda: rest.extend(server.stderr), daemon=True)
    reader.start()
    client = openai.OpenAI(base_url=re.search(r"at (http://\S+/v1)", line).group(1), api_key="none", max_retries=0)
    name = client.models.list().data[0].id

    def timed(**kwargs) -> float:
        t = time.perf_counter()
        out = client.chat.completions.create(model=name, max_tokens=32, **kwargs)
        if kwargs.get("stream"):
            list(out)
        return time.perf_counter() - t

    chats = [timed(messages=ASK, temperature=0) for _ in range(3)]
    streamed = timed(messages=ASK, temperature=0, stream=True)
    other = timed(messages=ASK, temperature=0.7)
    server.send_signal(signal.SIGTERM)
    code = server.wait(timeout=120)
    reader.join(timeout=5)
    return (f"listening after {listening:.1f} s; chat requests (32 tokens) {', '.join(f'{x:.2f}' for x in chats)} s; "
            f"streamed {streamed:.2f} s; another temperature {other:.2f} s; SIGTERM: exit {code}, "
            f"{''.join(rest).strip()!r}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Hugging Face model folder")
    parser.add_argument("--cache", help="the compilation cache's parent folder (default: a fresh temporary one)")
    args = parser.parse_args()
    cache = args.cache or tempfile.mkdtemp(prefix="serve-cache-")
    env = {**os.environ, "XDG_CACHE_HOME": cache}  # the trainer's cache lives under $XDG_CACHE_HOME/rl-variants/jax
    try:
        for start in ("cold cache", "warm cache"):
            print(f"{start}: {one_start(args.model, env)}", flush=True)
    finally:
        if args.cache is None:
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
