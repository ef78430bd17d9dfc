#!/usr/bin/env bash
# Installs the Debian 12 packages qparams builds and tests with; given the argument
# `bench`, also those `make bench` needs; given `image`, only what the container's
# build stage needs (no Python packages, which the image does not ship). Idempotent
# and quick when everything is present: apt runs only for what dpkg reports missing.
set -euo pipefail

packages=(
  build-essential cmake make pkg-config
  libabsl-dev
  libprotobuf-dev protobuf-compiler
  libgrpc++-dev protobuf-compiler-grpc
  zlib1g-dev openssl
  libcpp-httplib-dev  # the metrics endpoint (--metrics_listen); runtime: libcpp-httplib0.11
  libgtest-dev libgmock-dev
  libbenchmark-dev
  # scripts/ci-hardening.sh: clang, its sanitizer and libFuzzer runtimes (with
  # <fuzzer/FuzzedDataProvider.h>), and LLVM's OpenMP (with the Archer TSan tool).
  clang-14 libclang-rt-14-dev libomp-14-dev
)
if [ "${1:-}" != image ]; then
  # The Python client (python) and its tests, on Debian's own interpreter:
  # building it (setuptools, wheel; venv for the install test), its dependencies, and
  # torch, optional for users of the package but needed by the observers' tests.
  packages+=(python3 python3-setuptools python3-wheel python3-venv python3-grpcio
    python3-protobuf python3-numpy python3-torch python3-pytest)
  # The exports' independent consumers (onnx.checker), the report page's browser
  # test (headless Chromium), the balancer sharding routes through (HAProxy), and
  # the small real data set the PyTorch tests train on (scikit-learn's digits).
  packages+=(python3-onnx chromium haproxy python3-sklearn)
fi
if [ "${1:-}" = bench ]; then
  packages+=(jq gnuplot-nox)  # bench/run.sh: reading qparams-bench's JSON, the plot
  # bench/python_bench.py: torch's GEMMs on OpenBLAS, as a user's would run, rather
  # than on the reference BLAS that libblas3 provides alone (20x slower, which would
  # hide the observers' cost in the calibration pass).
  packages+=(libopenblas0-pthread)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
else
  sudo=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
