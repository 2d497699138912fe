#!/usr/bin/env bash
# The `verifiers` package (PyPI) in a virtual environment of its own, outside the repository.
#
# verifiers pins openai<3 while the workspace locks openai 3.x (the trainer's agents and its
# endpoint's tests use it), and it brings about a hundred packages of its own: it never enters the
# workspace. The adapter (apps/trainer/src/trainer/verifiers/) runs a verifiers environment in this
# venv as a child process whose OpenAI client points at the trainer's endpoint.
#
#   scripts/verifiers-env.sh            # creates $VERIFIERS_VENV (default ~/.cache/rl-variants/verifiers)
#   VERIFIERS_VENV=/some/dir scripts/verifiers-env.sh
#
# The `verifiers` test tier (uv run pytest -m verifiers) and rollout.agent
# `trainer.verifiers:agent` find the venv at the same place (or $VERIFIERS_PYTHON: its python).
set -euo pipefail
VENV="${VERIFIERS_VENV:-$HOME/.cache/rl-variants/verifiers}"
VERSION="${VERIFIERS_VERSION:-0.4.0}"
command -v uv >/dev/null 2>&1 || { echo "verifiers-env: needs uv (https://docs.astral.sh/uv/)" >&2; exit 1; }
uv venv --quiet --python 3.11 "$VENV"
uv pip install --quiet --python "$VENV/bin/python" "verifiers==$VERSION"
"$VENV/bin/python" -c "import verifiers, openai; print('verifiers', verifiers.__version__, 'openai', openai.__version__)"
echo "verifiers venv ready: $VENV/bin/python"
