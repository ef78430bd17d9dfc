# The two commands a fresh machine needs: `make test` and `make run`.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= 2
# ctest's parallel entries: most wait on sockets, processes and timeouts, not on the
# CPU, so twice the build's jobs finish sooner on the same cores (docs/testing.md).
TEST_JOBS ?= 4

.PHONY: all deps configure build test run bench hardening sanitize fuzz clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(TEST_JOBS)

# The server in the foreground on 127.0.0.1:50051, its sessions kept in ./data;
# Ctrl-C (SIGINT) stops it gracefully.
run: build
	exec $(BUILD_DIR)/server/qparams-server --listen=127.0.0.1:50051 --data_dir=./data

# The core and service benchmarks, their targets checked; tables in
# $(BUILD_DIR)/bench-results/RESULTS.md, plus a latency plot (bench/run.sh).
bench: build
	scripts/install-deps.sh bench
	bench/run.sh $(BUILD_DIR)

# scripts/ci-hardening.sh, each stage in its own build-* directory: ASan+UBSan on every
# test and TSan on the concurrency tests (sanitize), the fuzz targets for
# FUZZ_SECONDS (60) each (fuzz), or all three (hardening, as CI runs it).
hardening:
	scripts/ci-hardening.sh

sanitize:
	scripts/ci-hardening.sh asan tsan

fuzz:
	scripts/ci-hardening.sh fuzz

clean:
	rm -rf $(BUILD_DIR)
