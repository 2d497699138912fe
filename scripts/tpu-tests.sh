#!/usr/bin/env bash
# The fast tier on a TPU host (or any host installed from wheels), in one process: one process
# holds the chip at a time, and such a host may have no pytest-xdist, no uv and no sockets.
#
#   scripts/tpu-tests.sh OUT [pytest arguments, e.g. test paths or -k ...]
#
# OUT gets junit.xml, pytest.log (as it runs) and summary.md (passed / skipped by reason / failed).
# PYTHON names the interpreter (default python3); SHARD=I/N runs only shard I of N of the test files
# (a call each on a chip lent for minutes; scripts/tpu_tests.py merge tallies the shards' reports).
# LIMIT=S stops pytest with SIGINT after S seconds (the report keeps what ran); DONE="REPORT ..." leaves
# out every test those reports hold (junit files or `tpu_tests.py record` files; missing ones hold none),
# so a call given the earlier calls' reports resumes where they stopped.
# docs/development.md says what skips and why.
set -euo pipefail
out=${1:?usage: scripts/tpu-tests.sh OUT [pytest arguments]}
shift
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$root"
mapfile -t args < <("$python" scripts/tpu_tests.py args)
if [[ -n ${SHARD:-} ]]; then
  mapfile -t files < <("$python" scripts/tpu_tests.py shard "${SHARD%/*}" "${SHARD#*/}")
  args+=("${files[@]}")
fi
if [[ -n ${DONE:-} ]]; then
  mapfile -t done_args < <("$python" scripts/tpu_tests.py deselect $DONE)
  echo "left out: ${#done_args[@]} tests already reported" >&2
  args+=("${done_args[@]}")
fi
limit=()
[[ -n ${LIMIT:-} ]] && limit=(timeout -s INT "$LIMIT")
status=0
# -o addopts= drops pyproject's (pytest-xdist's options with them); `args` restores the rest
"${limit[@]}" "$python" -m pytest -o addopts= "${args[@]}" --junitxml="$out/junit.xml" "$@" 2>&1 \
  | tee "$out/pytest.log" || status=$?
if [[ -s $out/junit.xml ]]; then
  "$python" scripts/tpu_tests.py summary "$out/junit.xml" "$out/summary.md"
fi
exit "$status"
