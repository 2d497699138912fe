"""`python -m trainer.cli ...`, as the `trainer` command."""

import sys

from trainer.cli import main

sys.exit(main())
