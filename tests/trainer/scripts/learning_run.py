"""One run of a learning test, in a process of its own.

    python learning_run.py ALGO RUN_DIR BASE_CACHE [KEY=VALUE ...]

trains ALGO with the settings given (the base policy cached in BASE_CACHE) and
prints one JSON line: the held-out accuracy before and after. The learning tests
run here with XLA's own settings, as `trainer` runs, not with the suite's
compile-time flags (optimization level 0, older fusion emitters): these programs
run for hundreds of steps, in a third less time with XLA's defaults.
"""

import json
import sys
from pathlib import Path

from trainer.run import train_run
from trainer.settings import build_settings


def main() -> None:
    algo, run_dir, base_cache, *overrides = sys.argv[1:]
    settings = build_settings(algo=algo, overrides=overrides)
    summary = train_run(settings, Path(run_dir), progress=False, log=lambda _: None, base_cache=Path(base_cache))
    print(json.dumps({"before": summary["before"]["eval/accuracy"], "after": summary["after"]["eval/accuracy"]}))


if __name__ == "__main__":
    main()
