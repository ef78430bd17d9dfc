#!/usr/bin/env bash
# make bench: the core benchmark, then the service against the in-process echo server
# (qparams-bench), then one replica straight and through HAProxy (bench/haproxy_hop.sh),
# then the Python client (bench/python_bench.py, on Debian's Python
# with the package built into BUILD_DIR/python) and QAT training (bench/qat_bench.py:
# RemoteFakeQuantize against torch.ao, W = 2), then the histogram calculators'
# Python side (bench/histogram_bench.py: torch.histc and torch.bincount on core_bench's
# binning data, the client's local histogram against sending the tensor), each target
# checked, then NVFP4 in torch (bench/nvfp4_bench.py on core_bench's weight) and the
# GetGroupQParams latency of a 64-member GLOBAL_AMAX group (qparams-bench --mode group),
# then the online move of a slot range of 10,000 sessions (bench/reshard_bench.py);
# the steps scenario (qparams-bench --mode steps) runs a qparams-server pinned to CPU 0
# for the rate of applied step contributions per core;
# writes
# OUT/RESULTS.md (tables), the raw outputs, and OUT/latency_vs_concurrency.png.
#   bench/run.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, BUILD_DIR/bench-results)
# DURATION (default 8s) and ROUNDS (16) set each comparison's length: many short
# turns, so that the bursts of load a shared VM sees fall on both servers alike.
# SCRATCH_DIR (/var/tmp) holds the restart scenario's data directory (about 3 GB).
# PY_ROUNDS (5) sets the turns of python_bench.py's calibration pass (about 4 s a
# turn on OpenBLAS, which `make bench` installs; 85 s on the reference BLAS).
# core_bench and histogram_bench.py run on as many OpenMP / torch threads as the
# machine has cores (OMP_NUM_THREADS=$(nproc), torch.set_num_threads(os.cpu_count())).
# core_bench writes its 256 MiB binning tensor to OUT for histogram_bench.py; it is
# removed at the end, as is its 32 MiB NVFP4 weight (and codes) for nvfp4_bench.py.
set -euo pipefail

build=${1:-build}
out=${2:-$build/bench-results}
duration=${DURATION:-8s}
rounds=${ROUNDS:-16}
qb="$build/bench/qparams-bench"
mkdir -p "$out"
rm -f "$out/service.jsonl"

echo "== core_bench (bench/core_bench.cc)"
OMP_NUM_THREADS=$(nproc) "$build/bench/core_bench" --benchmark_color=false \
  --histogram_data="$out/histogram_data.f32" --nvfp4_data="$out/nvfp4_data.bf16" \
  --json="$out/core_bench.json" |
  tee "$out/core_bench.txt"
jq -c '. + {scenario: "core"}' "$out/core_bench.json" >> "$out/service.jsonl"

# Runs qparams-bench with --json and the given flags, appending its object to
# service.jsonl, with the scenario's name.
scenario() {
  local name=$1
  shift
  echo "== $name: qparams-bench $*" >&2
  "$qb" --json "$@" | jq -c --arg name "$name" '. + {scenario: $name}' | tee -a "$out/service.jsonl"
}

compare=(--compare-echo --duration="$duration" --rounds="$rounds" --warmup=100ms)
scenario small_c1 --mode=observe --shape=64 --concurrency=1 "${compare[@]}"
scenario small_c8 --mode=observe --shape=64 --concurrency=8 "${compare[@]}"
scenario mib_c1 --mode=observe --shape=262144 --concurrency=1 --compare-parse-echo "${compare[@]}"
scenario mib_c8 --mode=observe --shape=262144 --concurrency=8 --compare-parse-echo "${compare[@]}"
scenario range --mode=range --shape=2048,4096 --granularity=per_channel:0 --compare-full \
  --duration="$duration" --rounds="$rounds" --warmup=100ms
for c in 1 2 4 8 16 32; do
  scenario "latency_c$c" --mode=observe --shape=64 --concurrency="$c" --compare-echo \
    --duration=4s --rounds=8 --warmup=100ms
done
# Histogram sessions: 1 MiB into entropy against the same into global_minmax, both with
# omit_qparams (no search per observation); then entropy as a caller gets it without
# omit_qparams (the search runs on every observation), for information.
scenario hist_mib_c1 --mode=observe --shape=262144 --calculator=entropy \
  --compare-calculator=global_minmax --omit-qparams --concurrency=1 \
  --duration="$duration" --rounds="$rounds" --warmup=100ms
scenario hist_mib_c1_qparams --mode=observe --shape=262144 --calculator=entropy \
  --compare-calculator=global_minmax --concurrency=1 --duration=4s --rounds=4 --warmup=100ms
# Idempotency keys (docs/retries.md): a small Observe with and without keys, taking
# turns on one server, in memory and journaled (batched) to a scratch directory.
scenario keys_memory --mode=observe --shape=64 --concurrency=1 --compare-keys \
  --duration="$duration" --rounds="$rounds" --warmup=100ms
keys_dir=$(mktemp -d "${SCRATCH_DIR:-/var/tmp}/qparams-keys-XXXXXX")
scenario keys_journal --mode=observe --shape=64 --concurrency=1 --compare-keys \
  --data_dir="$keys_dir" --duration="$duration" --rounds="$rounds" --warmup=100ms
rm -rf "$keys_dir"
# GetGroupQParams of a 64-member GLOBAL_AMAX group of NVFP4 weights, and of one member.
scenario group --mode=group --members=64 --shape=64,256 --dtype=bfloat16 --calls=2000 --rounds=4
scenario memory --mode=memory --sessions=100000 --channels=1024 --concurrency=8
# About 3 GB of data directory under SCRATCH_DIR (on disk, not tmpfs), removed after.
scenario restart --mode=restart --server_binary="$build/server/qparams-server" \
  --scratch_dir="${SCRATCH_DIR:-/var/tmp}" --sessions=100000 --channels=1024 --concurrency=8

# Step contributions (docs/qat.md, "Capacity"): 8 ranks x 200 per_tensor moving_average
# sessions, one Step call per rank per step (lag 1), a qparams-server process pinned to
# CPU 0 and the ranks to CPU 1 (unpinned on one core), in memory and journaled
# (batched) under SCRATCH_DIR, the two servers taking turns.
cpus=()
[ "$(nproc)" -ge 2 ] || cpus=(--server_cpus= --client_cpus=)
scenario steps --mode=steps --sessions=200 --ranks=8 --lag=1 \
  --server_binary="$build/server/qparams-server" --scratch_dir="${SCRATCH_DIR:-/var/tmp}" \
  --duration="$duration" --rounds=4 --warmup=300ms "${cpus[@]}"

# One replica straight and through HAProxy, in turns: the balancer's hop (issue 16).
DURATION="$duration" ROUNDS="$rounds" bench/haproxy_hop.sh "$build" "$out"

echo "== Python client: bench/python_bench.py" >&2
PYTHONPATH="$build/python" "${QPARAMS_PYTHON:-/usr/bin/python3}" bench/python_bench.py \
  --server-binary="$build/server/qparams-server" --rounds="${PY_ROUNDS:-5}" \
  --json="$out/python_bench.json" | tee "$out/python_bench.txt"
jq -c '. + {scenario: "python"}' "$out/python_bench.json" | tee -a "$out/service.jsonl"

# QAT training (docs/qat.md, "Training with RemoteFakeQuantize"): W = 2 gloo ranks, each
# model trained with RemoteFakeQuantize + QATRun (lag 1) and with torch.ao's default QAT
# qconfig, in turns: the step-time ratio and the RPCs per rank per step.
echo "== QAT training: bench/qat_bench.py" >&2
PYTHONPATH="$build/python" "${QPARAMS_PYTHON:-/usr/bin/python3}" bench/qat_bench.py \
  --server="$build/server/qparams-server" --json="$out/qat_bench.json" | tee "$out/qat_bench.txt"
jq -c '. + {scenario: "qat"}' "$out/qat_bench.json" | tee -a "$out/service.jsonl"

echo "== Histograms: bench/histogram_bench.py" >&2
PYTHONPATH="$build/python" "${QPARAMS_PYTHON:-/usr/bin/python3}" bench/histogram_bench.py \
  --data="$out/histogram_data.f32" --server-binary="$build/server/qparams-server" \
  --json="$out/histogram_bench.json" | tee "$out/histogram_bench.txt"
jq -c '. + {scenario: "histogram"}' "$out/histogram_bench.json" | tee -a "$out/service.jsonl"
rm -f "$out/histogram_data.f32"

echo "== NVFP4 in torch: bench/nvfp4_bench.py" >&2
PYTHONPATH="$build/python" "${QPARAMS_PYTHON:-/usr/bin/python3}" bench/nvfp4_bench.py \
  --data="$out/nvfp4_data.bf16" --core-json="$out/core_bench.json" \
  --json="$out/nvfp4_bench.json" | tee "$out/nvfp4_bench.txt"
jq -c '. + {scenario: "nvfp4"}' "$out/nvfp4_bench.json" | tee -a "$out/service.jsonl"
rm -f "$out"/nvfp4_data.bf16*

# The online move of slots 0:63 holding 10,000 sessions from r0 to r1, with writers
# observing the moving sessions before and through it.
echo "== Online move: bench/reshard_bench.py" >&2
PYTHONPATH="$build/python" "${QPARAMS_PYTHON:-/usr/bin/python3}" bench/reshard_bench.py \
  --server-binary="$build/server/qparams-server" --cli-binary="$build/tools/qparams-cli" \
  --sessions=10000 --json="$out/reshard_bench.json" | tee "$out/reshard_bench.txt"
jq -c '. + {scenario: "reshard"}' "$out/reshard_bench.json" | tee -a "$out/service.jsonl"

get() { jq -r "select(.scenario == \"$1\") | $2" "$out/service.jsonl"; }
verdict() { awk -v v="$1" -v t="$2" -v op="$3" \
  'BEGIN { ok = (op == ">=") ? (v >= t) : (op == "<=") ? (v <= t) : (v < t)
           print ok ? "met" : "MISSED" }'; }
# core_bench's table whose header starts with $1, up to the blank line after it.
core_table() { awk -v h="$1" 'index($0, h) == 1 { p = 1 } p && /^$/ { exit } p' "$out/core_bench.txt"; }
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

{
  echo "# qparams benchmark results"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')."
  echo
  echo "## Core: range pass vs read-and-sum (core_bench)"
  echo
  core_table "| dtype |"
  echo
  echo "## Histograms: binning, searches, observations, the client (issue 24)"
  echo
  echo "core_bench on $(get core .threads) OpenMP threads, torch on $(get histogram .torch_threads) intra-op threads (both set to the machine's cores). Binning: |x| of a 256 MiB float32 tensor (64M N(0, 1) values, 16 outliers of 20 to 35) into 4096 bins; torch reads the same bytes (written by core_bench), and its bincount histogram equals the core's: $(get histogram 'if .bincount_matches_core then "yes" else "NO" end')."
  echo
  core_table "| tensor |"
  echo
  echo "| scenario | qparams | other | ratio | target | |"
  echo "|---|---|---|---|---|---|"
  c=$(get core .bin_gbps)
  r=$(div "$c" "$(get histogram .torch_histc_reused_gbps)")
  echo "| Binning 256 MiB float32: core BinTensor vs torch.histc (ModelOpt's calls, abs into a reused buffer) | $c GB/s | $(get histogram .torch_histc_reused_gbps) GB/s | ${r}x | >= 3x | $(verdict "$r" 3 '>=') |"
  r=$(div "$c" "$(get histogram .torch_histc_gbps)")
  echo "| The same vs torch.histc as ModelOpt calls it (a fresh abs tensor per call) | $c GB/s | $(get histogram .torch_histc_gbps) GB/s | ${r}x | (information) | |"
  r=$(div "$c" "$(get histogram .torch_bincount_reused_gbps)")
  echo "| The same vs torch.bincount of floor(\|x\|·2^-e) (histogram.md §5.5, reused buffers) | $c GB/s | $(get histogram .torch_bincount_reused_gbps) GB/s | ${r}x | (information) | |"
  r=$(div "$c" "$(get histogram .torch_bincount_gbps)")
  echo "| The same vs torch.bincount as §5.5 writes it (fresh temporaries) | $c GB/s | $(get histogram .torch_bincount_gbps) GB/s | ${r}x | (information) | |"
  r=$(get hist_mib_c1 .calculator_ratio)
  echo "| Observe, 1 MiB float32, concurrency 1, omit_qparams: entropy session vs global_minmax session | $(get hist_mib_c1 .qps) QPS | $(get hist_mib_c1 .base_qps) QPS | $r | >= 0.8 | $(verdict "$r" 0.8 '>=') |"
  r=$(get hist_mib_c1_qparams .calculator_ratio)
  echo "| The same without omit_qparams (entropy searches on every observation) | $(get hist_mib_c1_qparams .qps) QPS | $(get hist_mib_c1_qparams .base_qps) QPS | $r | (information) | |"
  echo "| Python client, 16 MiB float32 into an entropy session: observe(reduce=\"always\") (local histogram) vs reduce=\"never\" (the tensor), bytes sent | $(get histogram .client_always_request_bytes) B | $(get histogram .client_never_request_bytes) B | $(get histogram .client_bytes_ratio)x fewer | (information) | |"
  echo "| The same, time per observation (the call, local binning included) | $(get histogram .client_always_ms) ms | $(get histogram .client_never_ms) ms | $(get histogram .client_time_ratio) | (information) | |"
  echo
  echo "- Both sessions of the client row end with the same histogram: $(get histogram 'if .client_histograms_equal then "yes" else "NO" end'). qparams.local_histogram alone: $(get histogram .client_local_histogram_ms) ms per 16 MiB tensor."
  echo "- torch read-and-sum (x.sum()) of the binning tensor, alongside torch's turns: $(get histogram .torch_read_gbps) GB/s; core_bench's read-and-sum alongside the core's: $(get core .bin_baseline_gbps) GB/s."
  echo
  core_table "| search |"
  echo
  echo "## NVFP4: block scales, torch, scale groups"
  echo
  core_table "| convention |"
  echo
  echo "| scenario | qparams | other | ratio | target | |"
  echo "|---|---|---|---|---|---|"
  for conv in compressed_tensors modelopt; do
    c=$(get core ".nvfp4_${conv}_gbps")
    t=$(get nvfp4 ".nvfp4_torch_${conv}_gbps")
    r=$(div "$c" "$t")
    echo "| NVFP4 block scales, 4096 x 4096 bfloat16, $conv: core (dynamic calculator) vs torch on the CPU (abs().amax(-1), divide, e4m3 encode), same codes: $(get nvfp4 "if .nvfp4_${conv}_matches_core then \"yes\" else \"NO\" end") | $c GB/s | $t GB/s | ${r}x | >= 3x | $(verdict "$r" 3 '>=') |"
  done
  echo "| GetGroupQParams, GLOBAL_AMAX group of $(get group .members) NVFP4 weights ($(get group .shape) $(get group .dtype) each, $(get group .response_bytes) B response), sequential: p50 / p99 / mean | $(get group .p50_us) / $(get group .p99_us) / $(get group .mean_us) µs | 1 member ($(get group .ref_response_bytes) B): $(get group .ref_p50_us) / $(get group .ref_p99_us) / $(get group .ref_mean_us) µs | | (information) | |"
  echo
  echo "- torch read-and-sum (x.sum()) of the weight, alongside torch's turns: $(get nvfp4 .nvfp4_torch_read_gbps) GB/s, on $(get nvfp4 .torch_threads) intra-op threads."
  echo
  echo "## Service vs the in-process echo server (qparams-bench)"
  echo
  echo "| scenario | qparams | echo | ratio | target | |"
  echo "|---|---|---|---|---|---|"
  for s in small_c1 small_c8; do
    r=$(get $s .ratio)
    echo "| Observe, 64 floats, concurrency ${s#small_c} | $(get $s .qps) QPS | $(get $s .echo_qps) QPS | $r | >= 0.85 | $(verdict "$r" 0.85 '>=') |"
  done
  for s in mib_c1 mib_c8; do
    r=$(get $s .ratio)
    echo "| Observe, 1 MiB float32, concurrency ${s#mib_c} | $(get $s .mb_per_s) MB/s | $(get $s .echo_mb_per_s) MB/s | $r | (information) | |"
    r=$(get $s .parse_ratio)
    echo "| Observe, 1 MiB float32, concurrency ${s#mib_c}, vs the parsing echo | $(get $s .mb_per_s) MB/s | $(get $s .parse_echo_mb_per_s) MB/s | $r | >= 0.90 | $(verdict "$r" 0.90 '>=') |"
  done
  for s in keys_memory keys_journal; do
    r=$(get $s .keys_cost)
    echo "| Observe, 64 floats, concurrency 1, ${s#keys_}: the cost of idempotency keys, keyed p50 / unkeyed p50 - 1 (by QPS: $(get $s .keys_qps_cost); the engine alone: $(get $s .engine_observe_ns) -> $(get $s .engine_keyed_observe_ns) ns) | $(get $s .keyed_p50_us) µs | unkeyed: $(get $s .p50_us) µs | $r | <= 0.05 | $(verdict "$r" 0.05 '<=') |"
  done
  r=$(get range .covered_ratio)
  echo "| Range observations of (2048, 4096) float32 per_channel vs full Observe, input bytes covered | $(get range .covered_mb_per_s) MB/s | full: $(get range .full_covered_mb_per_s) MB/s | ${r}x | >= 50x | $(verdict "$r" 50 '>=') |"
  r=$(get memory .rss_ratio)
  echo "| 100,000 moving_average sessions x 1,024 channels: RSS / raw buffer bytes | $(get memory '.rss_bytes / 1e6 | floor') MB | raw: $(get memory '.raw_bytes / 1e6 | floor') MB | $r | < 1.25 | $(verdict "$r" 1.25 '<') |"
  r=$(get restart .restart_ratio)
  echo "| The same sessions journaled (--data_dir, $(get restart '.data_dir_bytes / 1e6 | floor') MB), the server killed: restart to serving vs reading the directory once (cat) | $(get restart .restart_seconds) s | cat: $(get restart .read_seconds) s | $r | <= 3 | $(verdict "$r" 3 '<=') |"
  r=$(get restart .rss_ratio)
  echo "| The restarted server's RSS / raw buffer bytes (before the kill: $(get restart .rss_before_ratio)) | $(get restart '.rss_bytes / 1e6 | floor') MB | raw: $(get restart '.raw_bytes / 1e6 | floor') MB | $r | <= 1.25 | $(verdict "$r" 1.25 '<=') |"
  echo
  echo "## Step contributions (qparams-bench --mode steps)"
  echo
  echo "$(get steps .ranks) ranks x $(get steps .sessions) $(get steps .calculator) per_tensor sessions (ranges of a ($(get steps .input_shape)) float32 input), one Step call per rank at the start of each training step s carrying its ranges of step s - 1 (one per session) and its reads as of step s - $(get steps .lag); a qparams-server process on CPU(s) $(get steps .memory_server_allowed_cpus), the ranks on CPU(s) $(get steps '.client_cpus | if . == "" then "any" else . end'); the two servers take $(get steps .rounds) turns. \"others\": the cores other processes kept busy meanwhile. Target: >= 200,000 applied contributions per second per server core."
  echo
  echo "| durability | applied contributions/s | per server CPU-second | server CPU | steps/s | Step calls per rank per step | call p50 / p99 | journal per contribution | engine alone: contribution / read | others | target | |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for d in memory journal; do
    r=$(get steps ".${d}_contributions_per_s")
    echo "| $(get steps ".${d}_durability") | $r | $(get steps ".${d}_contributions_per_cpu_s") | $(get steps ".${d}_server_cpu_util") | $(get steps ".${d}_steps_per_s") | $(get steps ".${d}_rpcs_per_rank_step") | $(get steps ".${d}_p50_ms") / $(get steps ".${d}_p99_ms") ms | $(get steps ".${d}_journal_bytes_per_contribution") B | $(get steps ".${d}_engine_contribution_ns") / $(get steps ".${d}_engine_read_ns") ns | $(get steps ".${d}_other_load") | >= 200000 | $(verdict "$r" 200000 '>=') |"
  done
  echo
  echo "## One replica straight and through HAProxy (bench/haproxy_hop.sh)"
  echo
  cat "$out/haproxy_hop.md"
  echo
  echo "## Latency vs concurrency (Observe, 64 floats)"
  echo
  echo "| concurrency | qparams QPS | p50 µs | p99 µs | echo QPS | echo p50 µs | echo p99 µs | ratio |"
  echo "|---|---|---|---|---|---|---|---|"
  for c in 1 2 4 8 16 32; do
    jq -r "select(.scenario == \"latency_c$c\") | \"| \(.concurrency) | \(.qps) | \(.p50_us) | \(.p99_us) | \(.echo_qps) | \(.echo_p50_us) | \(.echo_p99_us) | \(.ratio) |\"" "$out/service.jsonl"
  done
  echo
  echo "## Python client (bench/python_bench.py)"
  echo
  echo "Medians over the rounds; a ratio is the median of the per-round ratios. torch: $(get python .torch_threads) intra-op thread(s), its default here."
  echo
  echo "| scenario | qparams | torch.ao / bare stub | ratio | target | |"
  echo "|---|---|---|---|---|---|"
  r=$(get python .calib_ratio)
  echo "| Calibration, $(get python .calib_layers) x Linear($(get python .calib_width), $(get python .calib_width)), batch $(get python .calib_batch), $(get python .calib_batches) batches, per-channel int8 activations: RemoteObserver (global_minmax) vs PerChannelMinMaxObserver, seconds incl. the final flush | $(get python .calib_remote_s) s | $(get python .calib_inprocess_s) s | $r | <= 1.25 | $(verdict "$r" 1.25 '<=') |"
  r=$(get python .observe_ratio)
  echo "| Observe, 64 floats, sequential: Client.observe(reduce=\"never\") vs the generated stub with a prebuilt request | $(get python .observe_client_cps) calls/s | $(get python .observe_stub_cps) calls/s | $r | >= 0.8 | $(verdict "$r" 0.8 '>=') |"
  echo
  echo "- Bytes per observation as sent (one ObserveRequest: the per-channel min and max of a ($(get python .calib_batch), $(get python .calib_width)) activation): $(get python .bytes_per_observation), against $(get python .raw_bytes_per_observation) raw ($(get python '.raw_bytes_per_observation / .bytes_per_observation | . * 10 | round / 10')x smaller)."
  echo "- Scales and zero points of RemoteObserver and PerChannelMinMaxObserver equal: $(get python 'if .calib_qparams_match then "yes" else "NO" end')."
  echo "- Client.observe with the default reduce=\"auto\" (sends the min and max): $(get python .observe_auto_cps) calls/s, $(get python .observe_auto_ratio) of the stub (information)."
  echo "- The observers alone, without the model (information): PerChannelMinMaxObserver $(get python .observers_only_inprocess_us_per_observation) µs per observation, RemoteObserver $(get python .observers_only_remote_us_per_observation) µs (forward, queue, ObserveBatch calls and final flush)."
  echo
  echo "## QAT training (bench/qat_bench.py)"
  echo
  echo "W = $(get qat .world) ranks (gloo, 1 torch thread each), global batch $(get qat .batch), DDP defaults, lag $(get qat .lag); $(get qat .rounds) rounds x $(get qat .steps) steps of each variant, in turns; a ratio is the median of the per-round ratios. Load average before: $(get qat '.load_before[0]'); other processes: $(get qat .other_processes_cores) cores."
  echo
  echo "| model (fake-quantize modules) | RemoteFakeQuantize + QATRun | torch.ao default QAT qconfig | ratio | target | | RPCs per rank per step | target | |"
  echo "|---|---|---|---|---|---|---|---|---|"
  for m in digits cnn deep; do
    r=$(get qat ".${m}_ratio_remote_vs_torch")
    n=$(get qat ".${m}_remote_rpcs_per_rank_step")
    echo "| $m ($(get qat ".${m}_modules")) | $(get qat ".${m}_remote_ms") ms | $(get qat ".${m}_torch_ms") ms | $r | <= 1.10 | $(verdict "$r" 1.10 '<=') | $n | 1 | $(verdict "$n" 1 '<=') |"
  done
  echo
  echo "- run.step (cnn): $(get qat .cnn_remote_run_step_ms) ms, of which the Step RPC $(get qat .cnn_remote_rpc_ms) ms; a Health.Check after 20 ms idle: $(get qat .cnn_health_cold_ms) ms. vs classic FakeQuantize: $(get qat .cnn_ratio_remote_vs_torch_fq)."
  echo
  echo "## Online move of a slot range (bench/reshard_bench.py)"
  echo
  echo "| sessions | copy s | frozen s | whole move s | Observe/s before | during the move | after |"
  echo "|---|---|---|---|---|---|---|"
  get reshard '"| \(.sessions) | \(.copy_seconds) | \(.frozen_seconds) | \(.move_seconds) | \(.observe_per_s_before) | \(.observe_per_s_during_move) | \(.observe_per_s_after) |"'
} > "$out/RESULTS.md"

jq -r 'select(.scenario | startswith("latency_c")) | "\(.concurrency) \(.p50_us) \(.p99_us) \(.echo_p50_us) \(.echo_p99_us)"' \
  "$out/service.jsonl" > "$out/latency.dat"
gnuplot -e "datafile='$out/latency.dat'; outfile='$out/latency_vs_concurrency.png'" \
  bench/plot_latency.gp

echo
cat "$out/RESULTS.md"
echo
echo "bench: wrote $out/RESULTS.md and $out/latency_vs_concurrency.png"
