#!/usr/bin/env bash
# ctest bench_smoke: every qparams-bench mode runs briefly against its in-process
# servers and prints the JSON fields bench/run.sh reads; bad flags fail clearly.
set -euo pipefail
qb=$1
short=(--duration=200ms --warmup=50ms --rounds=1 --json)

expect() {  # expect FIELD... -- ARGS...: qparams-bench ARGS prints every FIELD
  local fields=()
  while [ "$1" != -- ]; do fields+=("$1"); shift; done
  shift
  local json
  json=$("$qb" "$@")
  for f in "${fields[@]}"; do
    grep -q "\"$f\": " <<<"$json" || { echo "FAIL: no $f in: $json (args: $*)"; exit 1; }
  done
  echo "ok: $*"
}

expect qps p50_us p90_us p99_us max_us mb_per_s covered_mb_per_s echo_qps echo_mb_per_s ratio -- \
  --mode=observe --compare-echo --concurrency=2 "${short[@]}"
expect qps ratio -- --mode=stream --compare-echo "${short[@]}"
expect qps ratio -- --mode=compute --compare-echo --shape=8,16 --granularity=per_channel:0 "${short[@]}"
expect covered_mb_per_s full_covered_mb_per_s covered_ratio -- \
  --mode=range --compare-full --shape=64,256 --granularity=per_block:1:32 "${short[@]}"
expect rss_bytes raw_bytes rss_ratio -- --mode=memory --sessions=50 --channels=16 --json

for bad in --mode=nope --granularity=per_row --shape=4,0 --concurrency=0; do
  if err=$("$qb" "$bad" --duration=100ms 2>&1); then
    echo "FAIL: $bad was accepted"; exit 1
  fi
  grep -q "^error: INVALID_ARGUMENT: " <<<"$err" || { echo "FAIL: $bad: $err"; exit 1; }
  echo "ok: $bad refused: $err"
done
