#!/usr/bin/env bash
# ctest bench_smoke: every qparams-bench mode runs briefly against its in-process
# servers and prints the JSON fields bench/run.sh reads; bad flags fail clearly. Given
# a Python (with the qparams package on its PYTHONPATH) and qparams-server,
# the restart and steps modes and python_bench.py --quick run too, and print (write) the JSON
# fields run.sh reads; so do histogram_bench.py --quick and nvfp4_bench.py --quick.
#   bench/smoke_test.sh QPARAMS_BENCH [PYTHON QPARAMS_SERVER]
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
expect qps ratio parse_echo_qps parse_echo_mb_per_s parse_ratio -- \
  --mode=observe --shape=4096 --compare-echo --compare-parse-echo "${short[@]}"
expect qps ratio -- --mode=stream --compare-echo "${short[@]}"
expect qps ratio -- --mode=compute --compare-echo --shape=8,16 --granularity=per_channel:0 "${short[@]}"
expect covered_mb_per_s full_covered_mb_per_s covered_ratio -- \
  --mode=range --compare-full --shape=64,256 --granularity=per_block:1:32 "${short[@]}"
expect qps base_qps calculator_ratio -- --mode=observe --shape=4096 --calculator=entropy \
  --compare-calculator=global_minmax --omit-qparams "${short[@]}"
expect rss_bytes raw_bytes rss_ratio -- --mode=memory --sessions=50 --channels=16 --json
expect members response_bytes p50_us p99_us mean_us ref_response_bytes ref_p50_us ref_p99_us \
  ref_mean_us -- --mode=group --members=4 --shape=16,64 --dtype=bfloat16 --calls=20 --rounds=2 --json
if [ $# -ge 3 ]; then
  expect sessions_restored data_dir_bytes read_seconds restart_seconds restart_ratio rss_ratio \
    rss_before_ratio -- --mode=restart --server_binary="$3" --scratch_dir="${TMPDIR:-/tmp}" \
    --sessions=40 --channels=16 --concurrency=2 --json
  expect memory_contributions_per_s memory_contributions_per_cpu_s memory_rpcs_per_rank_step \
    memory_p50_ms memory_p99_ms memory_engine_contribution_ns journal_contributions_per_s \
    journal_contributions_per_cpu_s journal_journal_bytes_per_contribution journal_p99_ms -- \
    --mode=steps --server_binary="$3" --scratch_dir="${TMPDIR:-/tmp}" --sessions=8 --ranks=3 \
    --server_cpus= --client_cpus= --engine_steps=4 "${short[@]}"
fi

help=$("$qb" --help) || { echo "FAIL: --help exits $?"; exit 1; }
grep -q -- "--mode" <<<"$help" || { echo "FAIL: --help does not name --mode: $help"; exit 1; }
echo "ok: --help exits 0"

for bad in --mode=nope --granularity=per_row --shape=4,0 --concurrency=0 --mode=restart \
    --mode=steps; do
  if err=$("$qb" "$bad" --duration=100ms 2>&1); then
    echo "FAIL: $bad was accepted"; exit 1
  fi
  grep -q "^error: INVALID_ARGUMENT: " <<<"$err" || { echo "FAIL: $bad: $err"; exit 1; }
  echo "ok: $bad refused: $err"
done

if [ $# -ge 3 ]; then
  json=$(mktemp)
  trap 'rm -f "$json"' EXIT
  PYTHONDONTWRITEBYTECODE=1 "$2" "$(dirname "$0")/python_bench.py" --quick \
    --server-binary="$3" --json="$json" >/dev/null
  for f in calib_inprocess_s calib_remote_s calib_ratio bytes_per_observation \
      raw_bytes_per_observation calib_qparams_match observe_client_cps observe_stub_cps \
      observe_ratio observe_auto_cps observe_auto_ratio torch_threads; do
    grep -q "\"$f\": " "$json" || { echo "FAIL: no $f in: $(cat "$json")"; exit 1; }
  done
  grep -q '"calib_qparams_match": true' "$json" || {
    echo "FAIL: RemoteObserver and PerChannelMinMaxObserver differ: $(cat "$json")"; exit 1; }
  grep -q '"observe_counts_ok": true' "$json" || {
    echo "FAIL: observe lost calls: $(cat "$json")"; exit 1; }
  echo "ok: python_bench.py --quick"

  PYTHONDONTWRITEBYTECODE=1 "$2" "$(dirname "$0")/histogram_bench.py" --quick \
    --server-binary="$3" --json="$json" >/dev/null
  for f in torch_threads torch_read_gbps torch_histc_gbps torch_histc_reused_gbps \
      torch_bincount_gbps torch_bincount_reused_gbps client_always_request_bytes \
      client_never_request_bytes client_bytes_ratio client_always_ms client_never_ms \
      client_time_ratio client_local_histogram_ms; do
    grep -q "\"$f\": " "$json" || { echo "FAIL: no $f in: $(cat "$json")"; exit 1; }
  done
  grep -q '"client_histograms_equal": true' "$json" || {
    echo "FAIL: local and server-side histograms differ: $(cat "$json")"; exit 1; }
  grep -q '"client_always_kind": "histogram"' "$json" || {
    echo "FAIL: reduce=\"always\" did not send a histogram: $(cat "$json")"; exit 1; }
  echo "ok: histogram_bench.py --quick"

  PYTHONDONTWRITEBYTECODE=1 "$2" "$(dirname "$0")/nvfp4_bench.py" --quick --json="$json" >/dev/null
  for f in torch_threads nvfp4_torch_read_gbps nvfp4_torch_compressed_tensors_gbps \
      nvfp4_torch_modelopt_gbps; do
    grep -q "\"$f\": " "$json" || { echo "FAIL: no $f in: $(cat "$json")"; exit 1; }
  done
  echo "ok: nvfp4_bench.py --quick"
fi
