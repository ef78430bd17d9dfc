#!/usr/bin/env bash
# The sharded soak (docs/testing.md, "The sharded soak"): ctest's python_soak with
# QPARAMS_SOAK=1, on the build tree `make test` built (build/). .ci/run runs it once,
# after `make test`; `scripts/soak.sh RUNS` runs it RUNS times in a row (a stability
# check), stopping at the first failure. Each run's time is printed.
#
# Usage: scripts/soak.sh [RUNS]   (RUNS: 1 unless given)
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${1:-1}
if [[ $# -gt 1 || ! $runs =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [RUNS]   (RUNS: how many runs in a row, a positive integer)" >&2
  exit 2
fi
if [[ ! -f build/CTestTestfile.cmake ]]; then
  echo "$0: no build tree in build/: run make test first" >&2
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
for ((run = 1; run <= runs; run++)); do
  start=$SECONDS
  # --no-tests=error: a renamed entry must not pass as no test at all.
  if ! QPARAMS_SOAK=1 ctest --test-dir build -R '^python_soak$' --no-tests=error -V \
      --output-on-failure >"$log" 2>&1; then
    cat "$log"
    echo "soak: run $run of $runs FAILED after $((SECONDS - start)) s" >&2
    exit 1
  fi
  # pytest's summary: a skipped soak (QPARAMS_SOAK not reaching it) is a failure here.
  # ctest -V prefixes the test's lines with its number ("930: 2 passed in 31.02s").
  summary=$(sed -nE 's/^([0-9]+: )?([0-9]+ (passed|skipped|failed).* in [0-9.]+s).*/\2/p' "$log" |
              tail -n1)
  if [[ $summary != *passed* || $summary == *skipped* ]]; then
    cat "$log"
    echo "soak: run $run of $runs did not run the soak: ${summary:-no pytest summary}" >&2
    exit 1
  fi
  echo "soak: run $run of $runs passed in $((SECONDS - start)) s ($summary)"
done
