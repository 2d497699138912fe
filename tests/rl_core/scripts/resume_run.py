"""Fresh process: restore the latest checkpoint in RUN_DIR and train to the configured step count.

Usage: python resume_run.py RUN_DIR
Prints one JSON line: the step restored and the step reached.
"""

import json
import sys

from toy_run import RESUME_TOY, RESUME_TRAINING, make_learner


def main(run_dir: str) -> None:
    learner = make_learner(training=RESUME_TRAINING, output_dir=run_dir, toy=RESUME_TOY)
    if not learner.resume():
        raise SystemExit(f"no checkpoint in {run_dir}")
    restored = learner.step
    learner.train()
    learner.close()
    print(json.dumps({"restored_step": restored, "final_step": learner.step}))


if __name__ == "__main__":
    main(sys.argv[1])
