#!/usr/bin/env bash
# shellcheck disable=SC2317  # the stage_* functions are called as "stage_$stage"
# The hardening stages of CI (.ci/run runs it after `make test`), each in its own
# build directory (gitignored), all with clang:
#
#   asan  ASan+UBSan build (build-asan); the whole ctest suite
#   tsan  TSan build (build-tsan); the domain's unit tests and the service's unit and
#         concurrency tests (the domain, server, client and end-to-end test binaries)
#   fuzz  libFuzzer build (build-fuzz); every fuzz target (fuzz/README.md) for
#         $FUZZ_SECONDS, side by side, each on a copy of its committed seed corpus
#         (fuzz/corpus/<target>; the repo is never written), from seed $FUZZ_SEED
#
# Usage: scripts/ci-hardening.sh [asan] [tsan] [fuzz]   (no argument: all three)
# Environment: JOBS (2, the builds' jobs), TEST_JOBS (4, ctest's: the tests mostly wait
# on sockets and processes), FUZZ_SECONDS (60 per target), FUZZ_SEED (1), CLANGXX
# (clang++-14).
# A fixed seed makes CI's fuzzing repeatable: it runs a prefix of the same input
# sequence every time, so a local run that got further has tried every input CI will,
# and a crash CI finds reproduces. FUZZ_SEED=0 lets libFuzzer pick one, for exploring
# (fuzz/README.md).
# Every stage runs even if an earlier one failed; the exit status is 1 if any failed.
# Sanitizer builds compile only the targets their tests run. A sanitizer report or a
# fuzzer crash fails the stage; the fuzzer's reproducer lands in
# build-fuzz/run/<target>/artifacts/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD

JOBS=${JOBS:-2}
TEST_JOBS=${TEST_JOBS:-4}
FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_SEED=${FUZZ_SEED:-1}
CLANGXX=${CLANGXX:-clang++-14}
FUZZ_TARGETS=(fuzz_requests fuzz_restore fuzz_core)

scripts/install-deps.sh || exit 1

# -O1 -g: the sanitizers' recommended trade-off (asserts stay on).
CONFIGURE=(-DCMAKE_CXX_COMPILER="$CLANGXX" -DCMAKE_BUILD_TYPE=RelWithDebInfo
           "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g")

# Sanitizer settings of every test process (the tests spawn the server and the CLI,
# which inherit them).
export ASAN_OPTIONS="detect_leaks=1:detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# OpenSSL allocations of gRPC's TLS, which an exiting process can leave (sanitizers/lsan.supp).
export LSAN_OPTIONS="suppressions=$ROOT/sanitizers/lsan.supp:print_suppressions=0"

stage_asan() {
  # qparams_test_programs (tests/CMakeLists.txt): every program a ctest entry runs.
  cmake -S . -B build-asan "${CONFIGURE[@]}" -DQPARAMS_SANITIZE=address,undefined &&
    cmake --build build-asan -j"$JOBS" --target qparams_test_programs &&
    ctest --test-dir build-asan --output-on-failure -j"$TEST_JOBS"
}

stage_tsan() {
  # Debian's gRPC, protobuf and Abseil are not instrumented: TSan ignores what their
  # own code does (ignore_noninstrumented_modules) and learns their hand-offs from
  # sanitizers/tsan_absl_sync.cc and tsan_grpc_sync.cc (linked in by
  # cmake/hardening.cmake); the few reports left in gRPC's plumbing are suppressed,
  # each explained, in sanitizers/tsan.supp. libomp's threads are annotated by its
  # Archer tool.
  local archer
  archer=$(dpkg -L libomp-14-dev 2>/dev/null | grep '/libarcher\.so$' | head -n1)
  # The domain's unit tests and the service's unit and concurrency tests (ctest labels
  # of tests/CMakeLists.txt): every case of the binaries built here but the conformance
  # runs (ASan's). qparams_e2e_tests brings the server and CLI binaries it spawns.
  local labels='^(domain_unit|service_unit|service_concurrency)$'
  cmake -S . -B build-tsan "${CONFIGURE[@]}" -DQPARAMS_SANITIZE=thread &&
    cmake --build build-tsan -j"$JOBS" --target qparams_domain_tests qparams_server_tests \
      qparams_client_tests qparams_e2e_tests &&
    OMP_TOOL_LIBRARIES="$archer" \
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$ROOT/sanitizers/tsan.supp" \
    ctest --test-dir build-tsan --output-on-failure -j"$TEST_JOBS" -L "$labels"
}

stage_fuzz() {
  cmake -S . -B build-fuzz "${CONFIGURE[@]}" -DQPARAMS_FUZZ=ON &&
    cmake --build build-fuzz -j"$JOBS" --target "${FUZZ_TARGETS[@]}" || return 1
  # The targets run side by side (sharing the cores), on copies of their seed corpora.
  local target pids=() failed=0
  for target in "${FUZZ_TARGETS[@]}"; do
    local run=build-fuzz/run/$target
    rm -rf "$run" && mkdir -p "$run/corpus" "$run/artifacts"
    cp fuzz/corpus/"$target"/* "$run/corpus/"
    (
      cd "$run" &&
        QPARAMS_FUZZ_HISTORY=artifacts/history.seq \
        ASAN_OPTIONS="$ASAN_OPTIONS:detect_stack_use_after_return=0" \
        "$ROOT/build-fuzz/fuzz/$target" -seed="$FUZZ_SEED" -max_total_time="$FUZZ_SECONDS" -timeout=30 \
          -rss_limit_mb=4096 -print_final_stats=1 -dict="$ROOT/fuzz/$target.dict" \
          -artifact_prefix=artifacts/ corpus >fuzz.log 2>&1
    ) &
    pids+=($!)
  done
  local i=0
  for target in "${FUZZ_TARGETS[@]}"; do
    if wait "${pids[$i]}"; then
      echo "--- $target: no crash in ${FUZZ_SECONDS}s"
      grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' \
        "build-fuzz/run/$target/fuzz.log" | sed 's/^/    /'
    else
      echo "--- $target: FAILED; log build-fuzz/run/$target/fuzz.log; reproduce with:"
      find "build-fuzz/run/$target/artifacts/" -type f | sed "s|^|    build-fuzz/fuzz/$target |"
      grep -v '^#[0-9]' "build-fuzz/run/$target/fuzz.log" | tail -n 60
      failed=1
    fi
    i=$((i + 1))
  done
  return "$failed"
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(asan tsan fuzz)
summary=()
status=0
for stage in "${stages[@]}"; do
  case $stage in
    asan | tsan | fuzz) ;;
    *) echo "unknown stage '$stage' (asan, tsan, fuzz)" >&2; exit 2 ;;
  esac
  echo "=== hardening: $stage"
  start=$(date +%s)
  if "stage_$stage"; then result=ok; else result=FAILED; status=1; fi
  summary+=("$stage: $result in $(($(date +%s) - start))s")
done
echo "=== hardening summary"
printf '  %s\n' "${summary[@]}"
exit $status
