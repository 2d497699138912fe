"""`trainer serve`: a model folder or a run's policy behind an OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
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
    s.add_argument("--page-size", type=int, default=0, help="tokens per KV page (default: 64 on TPU, 16 elsewhere)")
    s.add_argument("--steps-per-sync", type=int, default=8, help="decode steps per device call (default: %(default)s)")
    s.add_argument("--prefill-chunk", type=int, default=256, help="prompt tokens per call (default: %(default)s)")
    s.add_argument("--num-pages", type=int, default=0,
                   help="KV pages (default: %(default)s: every slot at full length)")
    s.add_argument("--attention", default="auto", choices=("auto", "reference", "pallas"),
                   help="the paged engine's attention kernels (default: %(default)s)")
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
    from rl_core.rollout import PagedSettings

    from trainer.serve import EngineOptions, serve_in_thread, served_folder, served_run

    # the paged engine's settings, spelled as a run's rollout.options (--page-size: options.page_size)
    engine = PagedSettings(slots=args.slots, page_size=args.page_size, steps_per_sync=args.steps_per_sync,
                           prefill_chunk=args.prefill_chunk, num_pages=args.num_pages, attention=args.attention)
    options = EngineOptions(max_prompt_tokens=args.max_prompt_tokens, max_new_tokens=args.max_new_tokens,
                            engine=engine, tool_format=args.tool_format, seed=args.seed,
                            top_logprobs=args.top_logprobs, partial_rollouts=args.partial_rollouts)
    if args.model is not None:
        served = served_folder(args.model, options, name=args.served_model_name)
    else:
        served = served_run(args.run, options, step=args.step, name=args.served_model_name)
    with _StopSignals() as stop:
        running = serve_in_thread(served, args.host, args.port)
        if args.print_url:
            print(running.url, flush=True)
        print(f"trainer serve: {served.name} at {running.url} (tool calls: {served.tool_format}); "
              f"{stop.how} stops it", file=sys.stderr, flush=True)
        try:
            received = stop.wait(running.thread)
        finally:  # also on an error: the engine's thread is joined before the interpreter exits
            # open requests fail first, so their streams end with an error event and the HTTP server
            # then finds none running (it would cancel them, logging a traceback each)
            _stop_within(SHUTDOWN_S, stop, lambda: served.loop.close(abandon=True), running.stop)
    print(f"trainer serve: stopped ({received.name if received else 'the HTTP server ended'})", file=sys.stderr,
          flush=True)
    return 128 + signal.SIGINT if received == signal.SIGINT else 0


SHUTDOWN_S = 30.0
"""How long a stop waits for the HTTP server and the engine loop to stop before the process exits anyway."""


class _StopSignals:
    """SIGTERM (`kill PID`, `kill %1`) and SIGINT (Ctrl-C) ask the server to stop; a second one exits at once.

    A SIGINT that is ignored when the server starts stays ignored: a shell starts a background job
    (`trainer serve ... &` in a script) that way, and Ctrl-C is then meant for the script alone."""

    def __init__(self) -> None:
        self.received: signal.Signals | None = None
        self._event = threading.Event()
        self._previous: dict[int, Any] = {}
        catch_int = signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
        self.signals = (signal.SIGTERM, signal.SIGINT) if catch_int else (signal.SIGTERM,)
        self.how = "Ctrl-C or SIGTERM (kill PID)" if catch_int else "SIGTERM (kill PID; SIGINT is ignored)"

    def __enter__(self) -> _StopSignals:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, previous in self._previous.items():
            # stopped by a signal, the process is ending: one more (a repeated Ctrl-C) must not kill it in the
            # interpreter's exit, which would end it by that signal after "stopped"
            signal.signal(sig, signal.SIG_IGN if self.received is not None else previous)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.received is not None:  # a second signal while stopping
            print(f"trainer serve: {signal.Signals(signum).name} again: exiting now", file=sys.stderr, flush=True)
            os._exit(128 + signum)
        self.received = signal.Signals(signum)
        self._event.set()

    def wait(self, server: threading.Thread) -> signal.Signals | None:
        """The signal that asked to stop, or None when the HTTP server's thread ended by itself."""
        while server.is_alive() and not self._event.wait(0.5):  # short waits: handlers run in between
            pass
        return self.received

    def code(self) -> int:
        return 128 + (self.received or signal.SIGINT)


def _stop_within(seconds: float, signals: _StopSignals, *steps: Any) -> None:
    """Run the shutdown `steps` in order (the engine loop's thread joined: no thread is inside JAX when
    the interpreter exits); a server must stop when asked, so when they take longer than `seconds` (a
    request or an engine call that does not end) the process exits with 128 + the signal."""
    done = threading.Event()

    def run() -> None:
        for step in steps:
            step()
        done.set()

    threading.Thread(target=run, name="serve-shutdown", daemon=True).start()
    deadline = time.monotonic() + seconds
    while not done.wait(0.5):  # short waits, so that a second signal's handler runs
        if time.monotonic() > deadline:
            print(f"trainer serve: did not stop within {seconds:.0f} s; exiting", file=sys.stderr, flush=True)
            os._exit(signals.code())
