"""How `trainer serve` stops while streams are open: a server on a free port, `--streams` streamed
requests of `--tokens` tokens, then `--signals` SIGINTs 0.3 s apart `--after` seconds in; printed per
run: the exit status, how long the stop took, and everything the server wrote after its first line
(a clean stop writes one line; the issue's abort was `terminate called ... FATAL: exception not rethrown`).

    uv run python benchmarks/serve_stop.py MODEL_DIR [--runs 2] [--signals 2] [--after 6]
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai

# Ctrl-C as a terminal gives it (handled and unblocked, whatever this process inherited)
SERVE = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
         "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
         "from trainer.cli import main; sys.exit(main(sys.argv[1:]))")


def one_run(args: argparse.Namespace, after: float) -> str:
    server = subprocess.Popen([sys.executable, "-c", SERVE, "serve", "--model", args.model, "--port", "0",
                               "--max-new-tokens", str(args.tokens), "--slots", str(args.streams)],
                              stderr=subprocess.PIPE, text=True)
    first = server.stderr.readline()
    rest: list[str] = []
    reader = threading.Thread(target=lambda: rest.extend(server.stderr), daemon=True)
    reader.start()
    client = openai.OpenAI(base_url=re.search(r"at (http://\S+/v1)", first).group(1), api_key="none", max_retries=0)
    name = Path(args.model).name

    def stream(k: int) -> None:
        try:
            for _ in client.completions.create(model=name, prompt=f"hello {k}", max_tokens=args.tokens, stream=True):
                pass
        except Exception:  # noqa: BLE001 - cut off by the stop: what the server prints is the measure
            pass

    for k in range(args.streams):
        threading.Thread(target=stream, args=(k,), daemon=True).start()
    time.sleep(after)
    start = time.perf_counter()
    for n in range(args.signals):
        if n:
            time.sleep(0.3)
        server.send_signal(signal.SIGINT)
    code = server.wait(timeout=180)
    took = time.perf_counter() - start
    reader.join(timeout=5)
    return f"exit {code} after {took:.1f} s: {''.join(rest).strip()!r}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a Hugging Face model folder")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--signals", type=int, default=2, help="SIGINTs sent, 0.3 s apart (2: a repeated Ctrl-C)")
    parser.add_argument("--after", type=float, default=6.0, help="seconds into the streams (the k-th run: + 3 k)")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=380)
    args = parser.parse_args()
    for k in range(args.runs):
        print(f"run {k}: {one_run(args, args.after + 3 * k)}", flush=True)


if __name__ == "__main__":
    main()
