"""The `trainer` console script.

Importing the CLI imports JAX and every package (about a second); a Ctrl-C in that
second is one line and exit status 130, like a Ctrl-C anywhere else before training,
not a KeyboardInterrupt traceback from deep inside an import.
"""

from __future__ import annotations

import signal
import sys


def main(argv: list[str] | None = None) -> int:
    try:
        from trainer.cli import main as cli_main
    except KeyboardInterrupt:
        print("trainer: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
