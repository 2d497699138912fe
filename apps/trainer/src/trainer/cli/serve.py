"""`trainer serve`: a model folder or a run's policy behind an OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from typing import Any

from trainer.cli.common import location

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("serve", help="serve a model folder or a run's policy as an OpenAI-compatible endpoint")
    what = s.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", type=location, metavar="HF_DIR", help="a Hugging Face model folder")
    what.add_argument("--run", type=location, help="run folder written by `trainer train`")
    s.add_argument("--step", type=int, default=None, help="the run's checkpoint step (default: the latest)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    s.add_argument("--port", type=int, default=8000, help="port (default: %(default)s; 0: a free one)")
    s.add_argument("--served-model-name", default=None, help="the model's name in /v1/models (default: the folder's)")
    s.add_argument("--max-prompt-tokens", type=int, default=2048, help="longest prompt (default: %(default)s)")
    s.add_argument("--max-new-tokens", type=int, default=1024, help="most new tokens a sample (default: %(default)s)")
    s.add_argument("--slots", type=int, default=32, help="samples decoded at once (default: %(default)s)")
    s.add_argument("--page-size", type=int, default=16, help="tokens per KV page (default: %(default)s)")
    s.add_argument("--steps-per-sync", type=int, default=8, help="decode steps per device call (default: %(default)s)")
    s.add_argument("--prefill-chunk", type=int, default=256, help="prompt tokens per call (default: %(default)s)")
    s.add_argument("--print-url", action="store_true",
                   help="print the base URL alone on stdout once it listens (for a process that started it)")
    s.add_argument("--tool-format", default="auto", choices=("auto", "hermes", "qwen3_coder", "harmony"),
                   help="how the model writes tool calls (default: from its chat template)")
    s.add_argument("--seed", type=int, default=0, help="the engine's random key (default: %(default)s)")
    s.add_argument("--top-logprobs", type=int, default=20,
                   help="the most top_logprobs a request may ask for (default: %(default)s; 0: none computed)")
    s.add_argument("--partial-rollouts", default="off", choices=("off", "continue", "recompute"),
                   help="what a running generation does with weights published into it (/v1/engine/weights "
                        "with into_running; a trainer's rollout.partial_rollouts; default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: see the note above
    from trainer.serve import EngineOptions, serve_in_thread, served_folder, served_run

    options = EngineOptions(max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
                            slots=args.slots, page_size=args.page_size, steps_per_sync=args.steps_per_sync,
                            prefill_chunk=args.prefill_chunk, tool_format=args.tool_format, seed=args.seed,
                            top_logprobs=args.top_logprobs, partial_rollouts=args.partial_rollouts)
    if args.model is not None:
        served = served_folder(args.model, options, name=args.served_model_name)
    else:
        served = served_run(args.run, options, step=args.step, name=args.served_model_name)
    running = serve_in_thread(served, args.host, args.port)
    if args.print_url:
        print(running.url, flush=True)
    print(f"trainer serve: {served.name} at {running.url} (tool calls: {served.tool_format}); Ctrl-C stops",
          file=sys.stderr, flush=True)
    try:
        running.thread.join()
    finally:
        _stop_within(SHUTDOWN_S, running.stop, served.loop.close)
    return 0


SHUTDOWN_S = 30.0
"""How long Ctrl-C waits for the HTTP server and the engine loop to stop before the process exits anyway."""


def _stop_within(seconds: float, *steps: Any) -> None:
    """Run the shutdown `steps` in order; a server must stop on Ctrl-C, so when they take longer
    than `seconds` (a request or an engine call that does not end) the process exits with 130."""
    done = threading.Event()

    def run() -> None:
        for step in steps:
            step()
        done.set()

    threading.Thread(target=run, name="serve-shutdown", daemon=True).start()
    if not done.wait(seconds):
        print(f"trainer serve: did not stop within {seconds:.0f} s; exiting", file=sys.stderr, flush=True)
        os._exit(128 + signal.SIGINT)
